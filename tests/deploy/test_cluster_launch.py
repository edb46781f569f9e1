"""Multi-node launches (slime.deploy, tools/render_launch.py): the KubeRay RayJob and the Slurm script of a composed
config, their fields checked against the cluster option they came from. Neither Kubernetes nor Slurm runs here: the
manifest is checked against KubeRay's ray.io/v1 RayJob fields and the script through `bash -n` and its lines."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import pytest
import yaml

from tests.helpers.compose import ROOT

TOOL = [sys.executable, str(ROOT / "tools" / "render_launch.py")]
RUN = ["model=qwen3_8b", "data=digit_task", "rollout.rm_type=exact_match", "rollout.stop=[a b]"]


def render(kind: str, *overrides: str, options: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return subprocess.run([*TOOL, kind, *options, "--", *overrides], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(("cluster", "nodes"), [("two_nodes_16gpu", 2), ("four_nodes_32gpu", 4)])
def test_a_rayjob_has_a_head_and_a_worker_pod_per_further_node_each_with_its_gpus(cluster, nodes):
    proc = render("kuberay", *RUN, f"cluster={cluster}", options=("--name", "qwen3-8b", "--image", "reg/slime:1"))
    assert proc.returncode == 0, proc.stderr
    job = yaml.safe_load(proc.stdout)
    assert (job["apiVersion"], job["kind"], job["metadata"]["name"]) == ("ray.io/v1", "RayJob", "qwen3-8b")
    spec = job["spec"]
    head = spec["rayClusterSpec"]["headGroupSpec"]
    (workers,) = spec["rayClusterSpec"]["workerGroupSpecs"]
    assert workers["replicas"] == workers["minReplicas"] == workers["maxReplicas"] == nodes - 1
    for group in (head, workers):
        assert group["rayStartParams"]["num-gpus"] == "8"
        (container,) = group["template"]["spec"]["containers"]
        assert container["image"] == "reg/slime:1"
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "8"
        assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
    assert {"containerPort": 8265} in head["template"]["spec"]["containers"][0]["ports"]  # the job API
    # what the Ray Jobs launcher reserves per job of a sweep submitted there: one unit per GPU of the cluster
    assert json.loads(json.loads(head["rayStartParams"]["resources"])) == {"slime_devices": 8 * nodes}
    command = shlex.split(spec["entrypoint"].split("&&", 1)[1])
    assert command == ["python", "main.py", *RUN, f"cluster={cluster}", "cluster.ray_address=auto"]
    assert spec["shutdownAfterJobFinishes"] is True


def test_a_slurm_script_starts_one_ray_node_per_machine_then_the_run_on_the_head(tmp_path):
    out = tmp_path / "run.sbatch"
    proc = render("slurm", *RUN, "cluster=four_nodes_32gpu", options=("--name", "grpo", "--out", str(out)))
    assert proc.returncode == 0 and proc.stdout == "", proc.stderr
    script = out.read_text()
    assert subprocess.run(["bash", "-n", str(out)], capture_output=True).returncode == 0
    sbatch = [line.removeprefix("#SBATCH --").partition("=") for line in script.splitlines() if "#SBATCH" in line]
    assert {k: v for k, _, v in sbatch} == {
        "job-name": "grpo",
        "nodes": "4",
        "ntasks-per-node": "1",
        "gpus-per-node": "8",
        "cpus-per-task": "64",
        "exclusive": "",
    }
    lines = script.splitlines()
    assert any("ray start --head" in line for line in lines) and "--num-gpus=8 --block &" in script
    assert """--resources='{"slime_devices": 32}'""" in script
    assert 'ray start --address="$address" --num-gpus=8 --block &' in script
    assert 'python - "$address" 4 600' in script  # waits for the 4 nodes
    assert shlex.split(lines[-1]) == [
        "python",
        "main.py",
        *RUN,
        "cluster=four_nodes_32gpu",
        "cluster.ray_address=$address",
    ]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["model=qwen3_8b", "cluster=local_cpu"], "cluster.device=cpu"),
        (["cluster=two_nodes_16gpu", "cluster.ray_address=auto"], "cluster.ray_address is the launch's to set"),
        (["cluster=two_nodes_16gpu", "clusterx=1"], "do not compose"),
    ],
)
def test_a_config_that_cannot_launch_so_exits_2_saying_why(overrides, message):
    proc = render("slurm", *overrides)
    assert proc.returncode == 2 and message in proc.stderr and proc.stdout == ""
