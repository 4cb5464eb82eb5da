"""One optimizer object over AdamW groups and Muon groups (docs/paper.md §3.2: Muon for the block matrices, AdamW for
everything else), so the trainer and torch.distributed.checkpoint see a single ordinary torch.optim.Optimizer.

Design: `HybridOptimizer` is a plain torch.optim.Optimizer that owns every param group and one shared `state`,
and does no math itself. It drives two engines: a stock `torch.optim.AdamW` (so fused/foreach kernels, DTensor
support and the exact `{"step", "exp_avg", "exp_avg_sq"}` state layout are torch's own, untouched) and our
`Muon` (optim/muon.py, state `{"momentum_buffer"}`). Before each step the engines are pointed at the outer
object's current groups of their kind and at its state dict; nothing is copied, so `load_state_dict`, an lr
written into `param_groups`, or a schedule all act on the single source of truth.

Why this works with DCP (`get_optimizer_state_dict` / `set_optimizer_state_dict` in
torch.distributed.checkpoint.state_dict): those helpers only need `param_groups`, `state` keyed by parameter,
`state_dict()`, `load_state_dict()`, and a `step()` that accepts zero gradients at lr 0 (used to create empty
state before a load). All of that is the base class's. Tests: tests/test_optim_dist.py saves under 2-rank FSDP2
and resumes with identical steps.

On load the checkpoint supplies the *state* (moments, momentum, step counts) while the live param-group
hyperparameters (betas, wd, fused, …) stay those of the running config, which is the resolved config saved with
the run; torch's default would silently adopt the checkpoint's. Group names must match, so a checkpoint from a
different optimizer or weight-decay mode fails with a message instead of a size mismatch.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from optim.muon import Muon

KINDS = ("adamw", "muon")


class HybridOptimizer(torch.optim.Optimizer):
    """AdamW for groups with kind "adamw", Muon for kind "muon" (build groups with optim.groups.param_groups)."""

    def __init__(self, groups: list[dict[str, Any]], fused: bool = False) -> None:
        for g in groups:
            if g.get("kind") not in KINDS or "name" not in g:
                raise ValueError(f"every param group needs a name and a kind in {KINDS}; got {sorted(g)}")
        adamw_groups = [g for g in groups if g["kind"] == "adamw"]
        muon_groups = [g for g in groups if g["kind"] == "muon"]
        # The engines are built first: their constructors validate the groups and fill each group dict (the same
        # dict objects the outer optimizer keeps) with their own defaults (amsgrad, foreach, fused, nesterov, …).
        # Fused (the trainer's choice, on CUDA and CPU alike): one kernel per parameter, with the device-side
        # `found_inf` skip. Unfused, the multi-tensor (foreach) kernels everywhere: torch picks them by itself only on
        # CUDA, and on CPU the per-tensor loop pays Python and DTensor dispatch per parameter — the scale vectors are
        # many small ones (114 tensors in the unified default).
        self._adamw = (torch.optim.AdamW(adamw_groups, fused=True if fused else None, foreach=None if fused else True)
                       if adamw_groups else None)
        self._muon = Muon(muon_groups) if muon_groups else None
        super().__init__(groups, defaults={})

    def _engines(self) -> list[torch.optim.Optimizer]:
        """The engines, pointed at this optimizer's current groups and state (which load_state_dict replaces)."""
        out = []
        for kind, engine in (("adamw", self._adamw), ("muon", self._muon)):
            if engine is not None:
                engine.param_groups = [g for g in self.param_groups if g["kind"] == kind]
                engine.state = self.state
                out.append(engine)
        return out

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], float]] = None, found_inf: Optional[torch.Tensor] = None
             ) -> Optional[float]:
        """`found_inf`: a 0-dim float tensor on the device; nonzero turns the whole step into a no-op (weights,
        moments, momentum and AdamW's step counts untouched) decided on the device, so the trainer never reads the
        non-finite check on the host (train.on_nonfinite). AdamW takes it through torch's fused kernel (the
        GradScaler contract: `optimizer.found_inf`), Muon through its own `found_inf` argument."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if found_inf is not None and self._adamw is not None and not self.fused:
            raise ValueError("found_inf needs the fused AdamW kernel (build the optimizer with fused=True)")
        for engine in self._engines():
            if engine is self._adamw:
                engine.found_inf = found_inf  # read by torch.optim.AdamW.step (None: an ordinary step)
                engine.step()
            else:
                engine.step(found_inf=found_inf)
        return loss

    @property
    def fused(self) -> bool:
        return self._adamw is not None and bool(self._adamw.defaults.get("fused"))

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        live = [{k: v for k, v in g.items() if k != "params"} for g in self.param_groups]
        saved = [g.get("name") for g in state_dict["param_groups"]]
        if saved != [g["name"] for g in live]:
            raise ValueError(f"checkpoint optimizer groups {saved} differ from this run's {[g['name'] for g in live]}"
                             ": was optim.name, optim.scale_weight_decay or optim.scale_wd_invariant changed?")
        super().load_state_dict(state_dict)
        for group, hyper in zip(self.param_groups, live):
            group.update(hyper)
            if group["kind"] == "adamw":  # torch hosts `step` on the device only for fused/capturable AdamW
                on_device = group.get("fused") or group.get("capturable")
                for p in group["params"]:
                    st = self.state.get(p)
                    if st and torch.is_tensor(st.get("step")):
                        st["step"] = st["step"].to(device=p.device if on_device else "cpu", dtype=torch.float32)

