"""A PBS site's ``PATH`` on this machine: every command but Slurm's own, so that ``qstat``,
``qsub`` and ``qdel`` (Slurm's torque wrappers) are the only way to ask about a job."""

from __future__ import annotations

import os
from pathlib import Path

#: Slurm's own commands, which a PBS site has none of (the torque wrappers call sbatch, srun
#: and scancel from beside themselves, so those stay, as PBS's server runs its own)
SLURM_ONLY = ("scontrol", "squeue", "sacct", "sinfo", "sstat", "sacctmgr")


def pbs_site_path(tmp_path: Path) -> str:
    """A ``PATH`` with every command of this one but :data:`SLURM_ONLY`: the directories
    that hold none of them as they are, the others' commands linked from one of its own."""
    site = tmp_path / "pbs-site-bin"
    site.mkdir(exist_ok=True)
    kept = []
    for directory in os.environ["PATH"].split(os.pathsep):
        if not any(os.path.exists(os.path.join(directory, c)) for c in SLURM_ONLY):
            kept.append(directory)
            continue
        for name in os.listdir(directory):
            if name not in SLURM_ONLY and not (site / name).exists():
                (site / name).symlink_to(os.path.join(directory, name))
    return os.pathsep.join([str(site), *kept])
