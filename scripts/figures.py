"""The figures' registry moved to repro/figures.py; this name is kept only for the one importer not yet changed
(tests/test_reproduce.py). Import from repro.figures."""
from repro.figures import FIGURES, FIGURES_DIR, STRATEGY, Figure, Panel  # noqa: F401
