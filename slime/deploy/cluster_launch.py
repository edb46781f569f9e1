"""A run on a multi-node Ray cluster, written out for the two schedulers our users launch on: a KubeRay `RayJob`
manifest and a Slurm batch script. Both start one Ray node per machine (the head on the first), each declaring the
machine's GPUs, then run `python main.py <overrides> cluster.ray_address=...` on the head; the run's placement group
then spans the nodes (slime.driver.placement). Pure text: nothing here needs Kubernetes, Slurm or Ray.

KubeRay's fields follow its `ray.io/v1` RayJob CRD (`entrypoint`, `rayClusterSpec.headGroupSpec`,
`workerGroupSpecs[*].replicas`, `rayStartParams`); the job's entrypoint runs on the head pod, where KubeRay sets
`RAY_ADDRESS`, so the run joins with `cluster.ray_address=auto`.
"""

from __future__ import annotations

import dataclasses
import json
import shlex

RAY_PORT = 6379  # the head's GCS port (Ray's default)
DASHBOARD_PORT = 8265  # Ray's dashboard and job API: hydra/launcher=ray_jobs submits sweeps there
CLIENT_PORT = 10001
DEVICE_RESOURCE = "slime_devices"  # hydra_plugins/ray_jobs_launcher's default `device_resource`
JOIN_TIMEOUT_S = 600  # how long the Slurm script waits for every node to join before it gives up


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClusterLaunch:
    """What a launch needs: the run's own overrides, and the machines (from the composed `cluster` config)."""

    name: str  # the job's name (Kubernetes object name, Slurm job name)
    overrides: tuple[str, ...]  # `python main.py` arguments, as typed
    num_nodes: int  # cluster.num_nodes
    gpus_per_node: int  # cluster.num_gpus_per_node
    image: str = "slime-hydra:latest"  # the container image (KubeRay) holding this repository and its packages
    ray_version: str = "2.60.0"
    cpus_per_node: int = 64
    memory_per_node: str = "512Gi"
    shm_size: str = "64Gi"  # /dev/shm: NCCL and the CPU weight buckets live there
    workdir: str = "/workspace/slime-hydra"  # the repository's checkout on every node

    def device_resource(self) -> str:
        """The head's `--resources`: one `slime_devices` unit per GPU of the cluster, which the Ray Jobs launcher
        (hydra/launcher=ray_jobs) reserves per job, so a sweep submitted to the dashboard runs jobs as GPUs free up."""
        return json.dumps({DEVICE_RESOURCE: self.num_nodes * self.gpus_per_node})

    def main_command(self, ray_address: str) -> str:
        """The run's command line on the head node; `ray_address` goes in as given (a shell variable may expand)."""
        args = " ".join(shlex.quote(a) for a in self.overrides)
        return f"python main.py {args} cluster.ray_address={ray_address}"


def rayjob_manifest(launch: ClusterLaunch) -> dict:
    """A KubeRay RayJob (apiVersion ray.io/v1): a head pod and `num_nodes - 1` worker pods of `gpus_per_node` GPUs
    each, the run as its entrypoint, the cluster deleted when the job ends."""
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": {"name": launch.name},
        "spec": {
            "entrypoint": f"cd {launch.workdir} && {launch.main_command('auto')}",
            "shutdownAfterJobFinishes": True,
            "ttlSecondsAfterFinished": 600,
            "rayClusterSpec": {
                "rayVersion": launch.ray_version,
                "headGroupSpec": {
                    "rayStartParams": {
                        "dashboard-host": "0.0.0.0",
                        "num-gpus": str(launch.gpus_per_node),
                        # KubeRay's form for a JSON value: a JSON string holding the JSON (its docs' "{\"Custom1\": 1}")
                        "resources": json.dumps(launch.device_resource()),
                    },
                    "template": _pod(launch, "ray-head", ports=(RAY_PORT, DASHBOARD_PORT, CLIENT_PORT)),
                },
                "workerGroupSpecs": [
                    {
                        "groupName": "gpu-workers",
                        "replicas": launch.num_nodes - 1,
                        "minReplicas": launch.num_nodes - 1,
                        "maxReplicas": launch.num_nodes - 1,
                        "rayStartParams": {"num-gpus": str(launch.gpus_per_node)},
                        "template": _pod(launch, "ray-worker", ports=()),
                    }
                ],
            },
        },
    }


def _pod(launch: ClusterLaunch, name: str, *, ports: tuple[int, ...]) -> dict:
    """One node's pod: the whole machine's GPUs, CPUs and memory, and a memory-backed /dev/shm."""
    amounts = {"cpu": str(launch.cpus_per_node), "memory": launch.memory_per_node}
    amounts["nvidia.com/gpu"] = str(launch.gpus_per_node)
    container = {
        "name": name,
        "image": launch.image,
        "resources": {"limits": dict(amounts), "requests": dict(amounts)},
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
    }
    if ports:
        container["ports"] = [{"containerPort": p} for p in ports]
    shm = {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": launch.shm_size}}
    return {"spec": {"containers": [container], "volumes": [shm]}}


def slurm_script(launch: ClusterLaunch) -> str:
    """An sbatch script: one task per node; `ray start --head` on the first node and `ray start --address` on the
    others (each `--block`ing in the background), a wait until all `num_nodes` are alive, then the run on the
    head; the Ray nodes end with the job."""
    n, g = launch.num_nodes, launch.gpus_per_node
    return f"""#!/bin/bash
#SBATCH --job-name={launch.name}
#SBATCH --nodes={n}
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node={g}
#SBATCH --cpus-per-task={launch.cpus_per_node}
#SBATCH --exclusive
# A slime-hydra run on {n} nodes of {g} GPUs (rendered by tools/render_launch.py; sbatch this file).
set -euo pipefail
cd {shlex.quote(launch.workdir)}
nodes=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))
head=${{nodes[0]}}
head_ip=$(srun --nodes=1 --ntasks=1 -w "$head" hostname --ip-address | awk '{{print $1}}')
address="$head_ip:{RAY_PORT}"
srun --nodes=1 --ntasks=1 -w "$head" ray start --head --node-ip-address="$head_ip" --port={RAY_PORT} \\
    --dashboard-host=0.0.0.0 --num-gpus={g} --resources={shlex.quote(launch.device_resource())} --block &
sleep 10
for node in "${{nodes[@]:1}}"; do
    srun --nodes=1 --ntasks=1 -w "$node" ray start --address="$address" --num-gpus={g} --block &
done
python - "$address" {n} {JOIN_TIMEOUT_S} <<'WAIT'
import sys, time
import ray
ray.init(address=sys.argv[1])
want, end = int(sys.argv[2]), time.time() + float(sys.argv[3])
while sum(node["Alive"] for node in ray.nodes()) < want and time.time() < end:
    time.sleep(5)
alive = sum(node["Alive"] for node in ray.nodes())
sys.exit(0 if alive >= want else f"{{alive}} of {{want}} Ray nodes joined within {{sys.argv[3]}} s")
WAIT
{launch.main_command('"$address"')}
"""
