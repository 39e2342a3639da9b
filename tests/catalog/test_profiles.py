"""The profile catalog: the report's three configurations, and every way a profile can be refused."""

from __future__ import annotations

import pytest

from gguf_serve.catalog import ProfileError, ServingProfile
from gguf_serve.container.flags import llama_server_args
from gguf_serve.container.server import ALL_LAYERS, ServerSettings, Speculative
from tests.committed import GEMMA3_270M, PROFILES, QWEN36_35B_A3B, build_profile, local_profile

GPU_MTP = ServerSettings(parallel=1, threads=4, gpu_layers=ALL_LAYERS, speculative=Speculative())


def args_of(profile, **kw):
    args = llama_server_args(profile, "/models/m.gguf", **kw)
    return dict(zip(args[::1], args[1:] + [""], strict=True))


def test_the_reports_three_production_configurations():
    g, i, gpu = PROFILES["graviton-moe"], PROFILES["intel-moe"], PROFILES["gpu-mtp"]
    assert (g.stack_name, g.hardware.instance_type, g.model.name, g.mtp) == (
        "GravitonMoeStack", "c8g.4xlarge", "Qwen3.6-35B-A3B", False,
    )  # fmt: skip
    assert (i.stack_name, i.hardware.instance_type, i.model.name, i.mtp) == (
        "IntelMoeStack", "c8i.4xlarge", "Qwen3.6-35B-A3B", False,
    )  # fmt: skip
    assert (gpu.stack_name, gpu.hardware.instance_type, gpu.model.name, gpu.mtp) == (
        "GpuMtpStack", "g5.xlarge", "Qwen3.6-27B", True,
    )  # fmt: skip
    assert g.threads == 16 and i.threads == 8  # physical cores: Graviton4 has no SMT, the Xeon has two per core
    assert gpu.model.has_mtp_layers and gpu.server.parallel == 1


def test_flags_come_from_the_profile():
    gpu = args_of(PROFILES["gpu-mtp"])
    assert gpu["--spec-type"] == "draft-mtp" and gpu["--spec-draft-n-max"] == "2"
    assert gpu["--n-gpu-layers"] == str(ALL_LAYERS) and gpu["--parallel"] == "1"
    for name in ("graviton-moe", "intel-moe"):
        cpu = llama_server_args(PROFILES[name], "/m.gguf")
        assert not any(a.startswith("--spec") for a in cpu)
    g = args_of(PROFILES["graviton-moe"])
    assert g["--ctx-size"] == "65536" and g["--host"] == "0.0.0.0" and g["--port"] == "8080"
    assert g["--cache-ram"] == "4096"
    assert args_of(PROFILES["graviton-moe"], benchmark=True)["--cache-ram"] == "0"  # the report's method
    assert "--api-key" not in g


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_json_round_trip_is_exact(name):
    assert ServingProfile.from_json(PROFILES[name].to_json()) == PROFILES[name]


def test_35b_moe_on_g5_xlarge_is_refused_as_the_report_found():
    with pytest.raises(ProfileError, match=r"needs 2\d\.\d GiB .* g5\.xlarge has 22\.5 GiB of NVIDIA A10G memory"):
        build_profile(
            name="x", stack_name="X", instance_type="g5.xlarge", model=QWEN36_35B_A3B.name, server=GPU_MTP, image="cuda"
        )


def test_27b_fits_the_a10g():
    assert PROFILES["gpu-mtp"].memory_plan()["weights"] < 22.5


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"instance_type": "c8g.4xlargee"}, "unknown instance type 'c8g.4xlargee'"),
        ({"model": "Qwen9-1T"}, "unknown model"),
        ({"image": "x86-64-cpu"}, "image 'x86-64-cpu' is x86_64 but c8g.4xlarge is arm64"),
        ({"image": "cuda", "instance_type": "c8i.4xlarge"}, "needs a GPU instance"),
        ({"server": ServerSettings(gpu_layers=ALL_LAYERS)}, "has no GPU; set 0"),
        ({"model": GEMMA3_270M.name, "server": ServerSettings(speculative=Speculative())}, "has no MTP layers"),
        ({"server": ServerSettings(parallel=4, speculative=Speculative())}, "use parallel=1"),
        ({"server": ServerSettings(parallel=1, speculative=Speculative(draft_n_max=0))}, "draft_n_max must be 1-8"),
        ({"server": ServerSettings(threads=64)}, "has 16 vCPUs"),
        ({"server": ServerSettings(ctx_per_slot=131072, parallel=4)}, "has 32.0 GiB of RAM"),
        ({"server": ServerSettings(ctx_per_slot=128)}, "ctx_per_slot must be at least 512"),
    ],
)
def test_invalid_profiles_say_what_to_change(changes, message):
    kwargs = {
        "name": "bad", "stack_name": "BadStack", "instance_type": "c8g.4xlarge", "model": QWEN36_35B_A3B.name,
        "server": ServerSettings(), "image": "arm64-cpu",
    }  # fmt: skip
    with pytest.raises(ProfileError, match=message):
        build_profile(**{**kwargs, **changes})


def test_local_profile_scales_the_graviton_settings_to_this_machine():
    local = local_profile(port=18080)
    base = PROFILES["graviton-moe"]
    assert local.model == GEMMA3_270M and not local.mtp
    assert local.server.parallel == base.server.parallel and local.server.metrics == base.server.metrics
    assert local.server.host == "127.0.0.1" and local.server.port == 18080
    assert 1 <= local.threads <= local.hardware.vcpus


def test_boot_budget_covers_a_cold_single_stream_download():
    for p in PROFILES.values():
        assert p.boot_budget_s >= p.model.size_bytes / (15 * 1024 * 1024)
