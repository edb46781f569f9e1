"""Write the launch of a multi-node run: a KubeRay RayJob manifest or a Slurm batch script (slime.deploy).

    python tools/render_launch.py kuberay --name qwen3-8b -- model=qwen3_8b cluster=two_nodes_16gpu recipe=...
    python tools/render_launch.py slurm --out run.sbatch -- model=qwen3_8b cluster=four_nodes_32gpu ...

The overrides after `--` are the run's own (`python main.py` arguments); they are composed through the real config
tree, and the machines (`cluster.num_nodes` x `cluster.num_gpus_per_node`) come from the composed config. The
launch adds `cluster.ray_address` itself. Exit status 2 on a config that cannot be launched so.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402
from hydra import compose, initialize_config_dir  # noqa: E402
from hydra.errors import HydraException  # noqa: E402
from omegaconf.errors import OmegaConfBaseException  # noqa: E402

from slime.config.loader import to_run_config  # noqa: E402
from slime.deploy.cluster_launch import ClusterLaunch, rayjob_manifest, slurm_script  # noqa: E402
from slime.run_schema import register_configs  # noqa: E402

KINDS = {
    "kuberay": lambda launch: yaml.safe_dump(rayjob_manifest(launch), sort_keys=False),
    "slurm": slurm_script,
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kind", choices=sorted(KINDS))
    parser.add_argument("--name", default="slime-run", help="the job's name")
    parser.add_argument("--image", default="slime-hydra:latest", help="KubeRay: the container image")
    parser.add_argument("--workdir", default="/workspace/slime-hydra", help="the repository's path on every node")
    parser.add_argument("--out", help="write here instead of standard output")
    own, overrides = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    args = parser.parse_args(own)
    args.overrides = overrides  # the run's, after --
    return args


def launch_of(args: argparse.Namespace) -> ClusterLaunch:
    """The launch of the composed config, or SystemExit(2) naming what cannot be launched so."""
    register_configs()
    try:
        with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
            # the run directory is Hydra's at run time; composing here only reads the cluster
            overrides = ["paths.output_dir=/tmp/render_launch", *args.overrides]
            cluster = to_run_config(compose(config_name="config", overrides=overrides)).cluster
    except (HydraException, OmegaConfBaseException, ValueError) as exc:
        sys.exit(f"render_launch: the overrides do not compose: {exc}")
    if any(o.split("=", 1)[0].lstrip("+~") == "cluster.ray_address" for o in args.overrides):
        sys.exit("render_launch: cluster.ray_address is the launch's to set; drop it from the overrides")
    if cluster.device != "cuda":
        sys.exit(
            f"render_launch: cluster.device={cluster.device}: a launch of GPU nodes needs a GPU cluster option "
            "(cluster=two_nodes_16gpu, four_nodes_32gpu, one_node_8gpu, ...)"
        )
    return ClusterLaunch(
        name=args.name,
        overrides=tuple(args.overrides),
        num_nodes=cluster.num_nodes,
        gpus_per_node=cluster.num_gpus_per_node,
        image=args.image,
        workdir=args.workdir,
    )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        text = KINDS[args.kind](launch_of(args))
    except SystemExit as exc:
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
            raise SystemExit(2) from None
        raise
    if args.out:
        Path(args.out).write_text(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
