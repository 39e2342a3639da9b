"""Workstation cards and profiles as data: the memory fit with --n-cpu-moe, host RAM for the CPU-side experts,
the refusal naming the card that fits, the flag in argv and the runtime spec, and expert bytes from the lock's
tensor table (the real lock step over loopback on a small MoE GGUF)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from gguf_serve.catalog import ProfileError
from gguf_serve.catalog.loader import load_catalog
from gguf_serve.catalog.lock import lock_model
from gguf_serve.catalog.lockfile import read_lock, write_lock
from gguf_serve.container.flags import llama_server_args
from gguf_serve.container.server import ALL_LAYERS
from gguf_serve.container.spec import RuntimeSpec, RuntimeSpecError
from gguf_serve.local.hub.server import LocalScope
from tests.catalog.stand_in import ROOT
from tests.committed import default_catalog


@pytest.fixture()
def profiles(tmp_path: Path) -> Path:
    return Path(shutil.copytree(ROOT / "profiles", tmp_path / "profiles"))


def write(path: Path, text: str) -> None:
    path.write_text(text)


def test_committed_workstation_profiles_plan_per_card():
    c = default_catalog()
    plans = {n: (p.hardware.instance_type, p.model.name, p.server.n_cpu_moe, p.mtp) for n, p in
             c.workstation_profiles.items()}  # fmt: skip
    assert plans == {
        "rtx3060-moe": ("rtx-3060-12gb", "Qwen3.6-35B-A3B", 24, True),
        "rtx4060ti-moe": ("rtx-4060-ti-16gb", "Qwen3.6-35B-A3B", 16, True),
        "rtx4090-moe": ("rtx-4090", "Qwen3.6-35B-A3B", 0, True),
        "rtx4090-mtp": ("rtx-4090", "Qwen3.6-27B", 0, True),
        "rtx5090-moe": ("rtx-5090", "Qwen3.6-35B-A3B", 0, True),
        "rtx5090-mtp": ("rtx-5090", "Qwen3.6-27B", 0, True),
    }
    assert not any(p.stack_name for p in c.workstation_profiles.values())
    assert not set(c.workstation_profiles) & set(c.profiles)  # never a stack: not among the serving profiles
    assert set(c.hardware).isdisjoint(c.workstations)
    assert round(c.workstations["rtx-5090"].gpu_memory_gib) == 32  # the guide says 24 GB; NVIDIA says 32


def test_n_cpu_moe_reaches_argv_and_the_runtime_spec():
    p = default_catalog().workstation_profiles["rtx3060-moe"]
    args = llama_server_args(p, "/models/x.gguf")
    assert args[args.index("--n-cpu-moe") + 1] == "24" and "--cpu-moe" not in args
    assert "--n-cpu-moe" not in llama_server_args(default_catalog().workstation_profiles["rtx4090-moe"], "/m")
    roomy = default_catalog().workstation_profiles["rtx4060ti-moe"]  # 31 GiB of RAM holds every expert
    assert "--cpu-moe" in llama_server_args(roomy.with_server(n_cpu_moe=ALL_LAYERS), "/m")
    with pytest.raises(ProfileError, match=r"n_cpu_moe=999 keeps 19\.9 GiB of expert weights in host RAM.* 22\.9 GiB, "
                       r"more than 15\.5 GiB of host RAM"):  # fmt: skip
        p.with_server(n_cpu_moe=ALL_LAYERS)
    spec = RuntimeSpec.from_json(p.runtime_json())
    assert spec.server.n_cpu_moe == 24 and llama_server_args(spec, "/m") == llama_server_args(p, "/m")


def test_specs_without_the_field_are_unchanged_and_still_load():
    cloud = default_catalog().profiles["graviton-moe"].runtime_json()
    assert "n_cpu_moe" not in cloud  # user data, release ids and snapshots of the stacks stay as they were
    doc = json.loads(default_catalog().workstation_profiles["rtx4060ti-moe"].runtime_json())
    del doc["server"]["n_cpu_moe"]
    assert RuntimeSpec.from_json(json.dumps(doc)).server.n_cpu_moe == 0  # an older spec
    doc["server"]["n_cpu_moe"] = "16"
    with pytest.raises(RuntimeSpecError, match="n_cpu_moe must be int"):
        RuntimeSpec.from_json(json.dumps(doc))


def test_gpu_side_and_host_side_add_up():
    c = default_catalog()
    p = c.workstation_profiles["rtx3060-moe"]
    plan = p.memory_plan()
    assert plan["weights"] + plan["cpu_experts"] == pytest.approx(p.model.size_bytes / 2**30)
    assert plan["cpu_experts"] == pytest.approx(sum(p.model.expert_bytes_per_layer[:24]) / 2**30)
    assert len(p.model.expert_bytes_per_layer) == 41  # 40 blocks and the MTP block, each with 256 experts


def test_dense_model_too_big_names_the_card_that_fits(profiles: Path):
    write(profiles / "workstation" / "rtx4060ti-mtp.toml",
          'workstation = "rtx-4060-ti-16gb"\nmodel = "Qwen3.6-27B"\n[server]\nctx_per_slot = 32768\n')  # fmt: skip
    with pytest.raises(ProfileError) as e:
        load_catalog(profiles)
    msg = str(e.value)
    assert "rtx4060ti-mtp.toml: Qwen3.6-27B needs 19.3 GiB of GPU memory (weights 15.6, kv_cache 2.0" in msg
    assert "has 16.0 GiB; a 24 GB card fits it (rtx-4090)" in msg
    assert "--n-cpu-moe" not in msg  # dense: no experts to move


def test_moe_refusal_names_a_larger_card_and_a_smaller_one_with_n_cpu_moe(profiles: Path):
    write(profiles / "workstation" / "tiny.toml",
          'workstation = "rtx-3060-12gb"\nmodel = "Qwen3.6-35B-A3B"\nhost_memory_gib = 12\n'
          '[server]\ncache_ram_mib = 1024\n')  # fmt: skip
    with pytest.raises(ProfileError) as e:
        load_catalog(profiles)
    msg = str(e.value)
    assert (
        "fits rtx-3060-12gb's 12.0 GiB of GPU memory only with --n-cpu-moe 24, which needs 14.7 GiB of host RAM" in msg
    )
    assert "has 12.0 GiB" in msg
    assert "a 24 GB card fits it (rtx-4090), or 16 GB with --n-cpu-moe 16 (rtx-4060-ti-16gb" in msg


def test_explicit_n_cpu_moe_is_checked_not_replaced(profiles: Path):
    path = profiles / "workstation" / "rtx3060-moe.toml"
    write(path, path.read_text().replace('n_cpu_moe = "auto"', "n_cpu_moe = 10"))
    with pytest.raises(ProfileError, match=r"needs 1[0-9.]+ GiB of GPU memory with --n-cpu-moe 10 .* has 12.0 GiB"):
        load_catalog(profiles)
    write(path, path.read_text().replace("n_cpu_moe = 10", 'n_cpu_moe = "all"'))
    with pytest.raises(ProfileError, match=r"only with --cpu-moe, which needs 22\.9 GiB of host RAM .* has 15\.5 GiB"):
        load_catalog(profiles)  # every expert on the CPU: 16 GB of RAM cannot hold them
    path.unlink()
    path = profiles / "workstation" / "rtx4060ti-moe.toml"
    write(path, path.read_text().replace('n_cpu_moe = "auto"', 'n_cpu_moe = "all"'))
    p = load_catalog(profiles).workstation_profiles["rtx4060ti-moe"]
    assert p.server.n_cpu_moe == ALL_LAYERS and "--cpu-moe" in llama_server_args(p, "/m")


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (
            "gpu_memory_gib = 12.0\n",
            'gpu_memory_gib = 12.0\nami = "al2023-x86_64"\n',
            r"workstation\.rtx-3060-12gb: unknown key 'ami'; known keys: architecture, cpu, gpu",
        ),
        ("gpu_memory_gib = 12.0\n", "gpu_memory_gib = 12.0\nri_1yr_all_upfront_cny = 1\n", "unknown key 'ri_1yr"),
        ('gpu = "NVIDIA GeForce RTX 3060 12GB"\n', "", "gpu is missing or not a string"),
        ("gpu_memory_gib = 12.0\n", 'gpu_memory_gib = "12"\n', "gpu_memory_gib must be a number"),
    ],
)
def test_workstation_tables_refuse_cloud_keys_and_bad_types(profiles: Path, old: str, new: str, message: str):
    hw = profiles / "hardware.toml"
    text = hw.read_text()
    i = text.index('[workstation."rtx-3060-12gb"]')
    write(hw, text[:i] + text[i:].replace(old, new, 1))
    with pytest.raises(ProfileError, match=message):
        load_catalog(profiles)


def test_a_workstation_profile_is_never_a_stack(profiles: Path):
    path = profiles / "workstation" / "rtx4090-mtp.toml"
    write(path, 'stack = "WorkstationStack"\n' + path.read_text())
    with pytest.raises(ProfileError, match="a workstation profile is never a stack"):
        load_catalog(profiles)


def test_cloud_refusal_message_is_unchanged(profiles: Path):
    path = profiles / "serving" / "gpu-mtp.toml"
    write(path, path.read_text().replace('model = "Qwen3.6-27B"', 'model = "Qwen3.6-35B-A3B"')
          .replace("[server.speculative]", "[server.x]").replace('spec_type = "draft-mtp"\n', "")
          .replace("draft_n_max = 2", ""))  # fmt: skip
    text = path.read_text()
    write(path, text[: text.index("[server.x]")] + text[text.index("[fleet]") :])
    expected = r"needs 23\.3 GiB \(weights 21\.1, kv_cache 0\.6, recurrent_state 0\.1, reserve 1\.5\) but g5\.xlarge "
    with pytest.raises(ProfileError, match=expected + r"has 22\.5 GiB of NVIDIA A10G memory"):
        load_catalog(profiles)


def _tiny_moe(path: Path, blocks: int = 3, experts: int = 4) -> dict[int, int]:
    """A small MoE GGUF (qwen35moe names, random weights in mixed types) and its expert bytes per block."""
    import gguf

    w = gguf.GGUFWriter(str(path), "qwen35moe")
    w.add_block_count(blocks)
    w.add_expert_count(experts)
    w.add_uint32("qwen35moe.expert_feed_forward_length", 64)
    rng = np.random.default_rng(0)
    w.add_tensor("token_embd.weight", rng.standard_normal((32, 64), dtype=np.float32))
    for i in range(blocks):
        w.add_tensor(f"blk.{i}.ffn_gate_inp.weight", rng.standard_normal((experts, 64), dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_up_shexp.weight", rng.standard_normal((64, 64), dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_up_exps.weight", rng.standard_normal((experts, 64, 64), dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_gate_exps.weight", rng.standard_normal((experts, 64, 64)).astype(np.float16))
        w.add_tensor(
            f"blk.{i}.ffn_down_exps.weight", rng.standard_normal((experts, 64, 64 + 32 * i)).astype(np.float16)
        )
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    reader = gguf.GGUFReader(str(path))
    return {i: sum(int(t.n_bytes) for t in reader.tensors if t.name.startswith(f"blk.{i}.ffn_") and "_exps" in t.name)
            for i in range(blocks)}  # fmt: skip


def test_lock_records_expert_bytes_from_the_tensor_table(tmp_path: Path):
    gguf_path = tmp_path / "tiny-moe.gguf"
    expected = _tiny_moe(gguf_path)
    with LocalScope() as hub:
        hub.add_file("local/tiny-moe", "tiny-moe.gguf", gguf_path)
        result = lock_model("Tiny-MoE", repo="local/tiny-moe", file="tiny-moe.gguf", endpoint=hub.url)
    tensors = result.entry.tensors
    assert tensors["count"] == 1 + 3 * 5
    assert tensors["expert_bytes"] == [expected[i] for i in range(3)]
    assert len(set(tensors["expert_bytes"])) == 3  # each block's own bytes, not an average
    lock = tmp_path / "models.lock.toml"
    write_lock(lock, {"Tiny-MoE": result.entry})
    assert '["Tiny-MoE".tensors]' in lock.read_text()
    assert read_lock(lock)["Tiny-MoE"].tensors == tensors
    committed = read_lock(ROOT / "profiles" / "models.lock.toml")  # entries without [tensors] still read
    assert all(e.tensors == {} for e in committed.values())


def test_bad_tensors_table_is_refused(tmp_path: Path):
    lock = tmp_path / "models.lock.toml"
    text = (ROOT / "profiles" / "models.lock.toml").read_text()
    write(lock, text + '\n["Gemma-3-270M".tensors]\nexpert_bytes = [1, -2]\n')
    with pytest.raises(ProfileError, match="expert_bytes must list non-negative integers"):
        read_lock(lock)
