"""The reproduction of the paper's figures: which runs each figure needs, how a run becomes a CPU proxy, reading
runs, the statistics and the results page. The commands that use it are thin scripts in scripts/."""
