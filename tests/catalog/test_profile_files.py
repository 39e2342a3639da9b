"""Profiles as data: the committed files load into the report's profiles, and a bad file says file, key and fix."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gguf_serve.catalog import ProfileError
from gguf_serve.catalog.loader import load_catalog
from gguf_serve.catalog.profiles import deploy_refusal
from tests.catalog.stand_in import ROOT
from tests.committed import PROFILES


@pytest.fixture()
def profiles(tmp_path: Path) -> Path:
    return Path(shutil.copytree(ROOT / "profiles", tmp_path / "profiles"))


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))


def test_the_reports_profiles_and_the_headroom_profile_ship_as_data():
    stacks = {p.name: (p.stack_name, p.hardware.instance_type, p.model.name, p.mtp) for p in PROFILES.values()}
    assert stacks == {
        "graviton-moe": ("GravitonMoeStack", "c8g.4xlarge", "Qwen3.6-35B-A3B", False),
        "intel-moe": ("IntelMoeStack", "c8i.4xlarge", "Qwen3.6-35B-A3B", False),
        "gpu-mtp": ("GpuMtpStack", "g5.xlarge", "Qwen3.6-27B", True),
        "graviton-moe-headroom": ("GravitonMoeHeadroomStack", "c8g.8xlarge", "Qwen3.6-35B-A3B", False),
    }
    headroom = PROFILES["graviton-moe-headroom"]
    assert (headroom.hardware.vcpus, headroom.hardware.memory_gib, headroom.threads) == (32, 64, 32)
    assert headroom.hardware.price_is_estimate and headroom.hardware.ri_1yr_all_upfront_cny == 2 * 9069


def test_only_the_unpinned_27b_is_refused_for_deploy():
    refused = {p.stack_name: deploy_refusal(p) for p in PROFILES.values()}
    assert [s for s, why in refused.items() if why] == ["GpuMtpStack"]
    assert "run `gguf-serve-catalog lock Qwen3.6-27B`" in refused["GpuMtpStack"]


def test_a_new_profile_is_a_file(profiles: Path):
    (profiles / "serving" / "graviton-long.toml").write_text(
        'stack = "GravitonLongStack"\ninstance_type = "c8g.8xlarge"\nmodel = "Qwen3.6-35B-A3B"\nimage = "arm64-cpu"\n'
        "[server]\nctx_per_slot = 131072\nparallel = 1\n"
    )
    p = load_catalog(profiles).profile_by_stack("GravitonLongStack")
    assert p.name == "graviton-long" and p.server.ctx_total == 131072 and p.threads == 32


@pytest.mark.parametrize(
    ("file", "old", "new", "says"),
    [
        ("serving/graviton-moe.toml", "parallel = 2", "paralel = 2",
         r"graviton-moe.toml: server: unknown key 'paralel'; known keys: .*parallel"),
        ("serving/graviton-moe.toml", "parallel = 2", 'parallel = "2"',
         r"graviton-moe.toml: server: parallel must be an integer, got '2' \(str\)"),
        ("serving/graviton-moe.toml", 'instance_type = "c8g.4xlarge"\n', "",
         r"graviton-moe.toml: instance_type is missing or not a string"),
        ("serving/graviton-moe.toml", '"c8g.4xlarge"', '"c8g.4xlargee"',
         r"instance_type: unknown instance type 'c8g.4xlargee': use one of .*c8g.8xlarge.* \(profiles/hardware.toml\)"),
        ("serving/graviton-moe.toml", '"arm64-cpu"', '"x86-64-cpu"',
         r"image 'x86-64-cpu' is x86_64 but c8g.4xlarge is arm64; pick an image target built for arm64"),
        ("serving/graviton-moe.toml", "parallel = 2", "parallel = 8",
         r"profile 'graviton-moe': Qwen3.6-35B-A3B needs .* c8g.4xlarge has 32.0 GiB of RAM; pick a larger instance"),
        ("serving/intel-moe.toml", "[server]", "[server]\nthreads = 64",
         r"profile 'intel-moe': threads=64 but c8i.4xlarge has 16 vCPUs"),
        ("serving/graviton-moe.toml", "[server]", "[server.speculative]\n[server]",
         r"MTP with parallel=2 loses draft acceptance; use parallel=1"),
        ("hardware.toml", "vcpus = 16\nphysical_cores = 16", "physical_cores = 16",
         r'hardware.toml: instance."c8g.4xlarge": missing key \'vcpus\' \(an integer\)'),
        ("hardware.toml", 'memory_gib = 32\ncpu = "AWS', 'memory_gib = "32 GiB"\ncpu = "AWS',
         r'instance."c8g.4xlarge": memory_gib must be a number, got \'32 GiB\''),
        ("models.toml", 'file = "Qwen3.6-27B-Q4_K_M.gguf"', 'file = "Qwen3.6-27B-Q8_0.gguf"',
         r"models.lock.toml: 'Qwen3.6-27B' was locked for .*Q4_K_M.gguf@master but .*Q8_0.gguf@master; "
         r"run `gguf-serve-catalog lock Qwen3.6-27B`"),
        ("models.toml", "total_params_b = 35", "total_params = 35", r"models.toml: \"Qwen3.6-35B-A3B\": unknown key"),
        ("serving/gpu-mtp.toml", '"Qwen3.6-27B"', '"Qwen3.6-9B"',
         r"model 'Qwen3.6-9B' is not locked: declare it in profiles/models.toml and run `gguf-serve-catalog lock"),
        ("serving/intel-moe.toml", '"IntelMoeStack"', '"GravitonMoeStack"', r"stack 'GravitonMoeStack' is already"),
    ],
)  # fmt: skip
def test_a_bad_profile_file_says_file_key_and_fix(profiles: Path, file: str, old: str, new: str, says: str):
    edit(profiles / file, old, new)
    with pytest.raises(ProfileError, match=says):
        load_catalog(profiles)


LOCK, HW, GRAVITON = "models.lock.toml", "hardware.toml", "serving/graviton-moe.toml"
SHA_35B = "0b21525e972670ed59e1812e170b27c26355381f0656ecc4e25617ece7dac58b"
BLOCKS_35B = "embedding_length = 2048\nblock_count = 41"


@pytest.mark.parametrize(
    ("file", "old", "new", "says"),
    [
        (LOCK, SHA_35B, "nothex",
         r'models.lock.toml: "Qwen3.6-35B-A3B".sha256: \'nothex\' is not a sha256; allowed: 64 lowercase hex digits'),
        (LOCK, "size_bytes = 22663387424", "size_bytes = -1",
         r'models.lock.toml: "Qwen3.6-35B-A3B".size_bytes: -1 bytes; allowed: 1 to 17,592,186,044,416 bytes'),
        (LOCK, "size_bytes = 22663387424", f"size_bytes = {2**60}",
         r'"Qwen3.6-35B-A3B".size_bytes: 1,152,921,504,606,846,976 bytes; allowed: 1 to .* gp3\'s largest volume'),
        (LOCK, BLOCKS_35B, BLOCKS_35B.replace("41", "0"),
         r'models.lock.toml: "Qwen3.6-35B-A3B".gguf.block_count: 0; allowed: a positive integer'),
        (HW, "vcpus = 16\nphysical_cores = 16  #", "vcpus = 0\nphysical_cores = 16  #",
         r'hardware.toml: instance."c8g.4xlarge".vcpus: 0 is below the range; allowed: 1 to 896 vCPUs'),
        (HW, "ri_1yr_all_upfront_cny = 9069", "ri_1yr_all_upfront_cny = nan",
         r'instance."c8g.4xlarge".ri_1yr_all_upfront_cny: nan is not a number; allowed: 0 to 100,000,000 yuan'),
        (HW, "ri_1yr_all_upfront_cny = 9069", "ri_1yr_all_upfront_cny = -9069",
         r'instance."c8g.4xlarge".ri_1yr_all_upfront_cny: -9069 is below the range; allowed: 0 to'),
        (HW, 'memory_gib = 32\ncpu = "AWS', 'memory_gib = -32\ncpu = "AWS',
         r'hardware.toml: instance."c8g.4xlarge".memory_gib: -32 is below the range; allowed: 0.5 to 32,768 GiB'),
        (GRAVITON, "[server]", "[server]\nport = 70000",
         r"graviton-moe.toml: server.port: 70000 is above the range; allowed: 1,024 to 65,535 TCP port"),
        (GRAVITON, "[fleet]", "[fleet]\nmax_capacity = 100000",
         r"graviton-moe.toml: fleet.max_capacity: 100000 is above the range; allowed: 1 to 100 instances"),
        (GRAVITON, "[fleet]", "[fleet]\nmin_capacity = 5\nmax_capacity = 4",
         r"graviton-moe.toml: fleet.min_capacity: 5 is more than max_capacity \(4\); allowed: 0 to max_capacity"),
        ("models.toml", "active_params_b = 3\n", "active_params_b = 36\n",
         r'models.toml: "Qwen3.6-35B-A3B".active_params_b: 36 is more than total_params_b \(35\); allowed: at most'),
        (GRAVITON, "[fleet]", "[fleet]\nspot = true",
         r"graviton-moe.toml: fleet.spot: a deploy option, .*; remove it here and set spot in deploy.toml"),
        (GRAVITON, "[fleet]", "[fleet]\nscale = 2",
         r"graviton-moe.toml: fleet: unknown key 'scale'; known keys: .*alb_idle_timeout_s, cache_read_mib_s"),
        (GRAVITON, "[fleet]", '[fleet]\nvpc_cidr = "10.40.0.0/33"',
         r"graviton-moe.toml: fleet.vpc_cidr: '10.40.0.0/33' is not allowed; allowed: an IPv4 network from /16 to /24"),
        ("serving/gpu-mtp.toml", 'spec_type = "draft-mtp"', 'spec_type = "draft-mpt"',
         r"gpu-mtp.toml: server.speculative.spec_type: 'draft-mpt' is not allowed; allowed: 'draft-mtp'"),
        ("models.toml", 'repo = "unsloth/Qwen3.6-27B-MTP-GGUF"', 'repo = "Qwen3.6-27B-MTP-GGUF"',
         r'models.toml: "Qwen3.6-27B".repo: \'Qwen3.6-27B-MTP-GGUF\' is not allowed; allowed: owner/name, each'),
    ],
)  # fmt: skip
def test_a_value_out_of_range_says_file_key_what_is_wrong_and_what_is_allowed(
    profiles: Path, file: str, old: str, new: str, says: str
):
    edit(profiles / file, old, new)
    with pytest.raises(ProfileError, match=says):
        load_catalog(profiles)


def test_every_number_a_profile_file_sets_has_a_range():
    import typing
    from dataclasses import fields

    from gguf_serve.catalog.fleet import FleetSettings
    from gguf_serve.catalog.limits import RANGES

    assert set(FleetSettings.parts().values()) <= set(RANGES)  # every part of [fleet] is checked
    for cls, ranges in RANGES.items():
        hints = typing.get_type_hints(cls)
        numeric = {f.name for f in fields(cls) if any(t in (int, float) for t in _leaf_types(hints[f.name]))}
        computed = {"size_bytes", "kv_bytes_per_token", "recurrent_state_bytes_per_slot", "expert_bytes_per_layer"}
        missing = numeric - set(ranges) - (computed if cls.__name__ == "ModelArtifact" else set())
        assert not missing, f"{cls.__name__}: give {sorted(missing)} a range in catalog/limits.py"


def _leaf_types(hint):
    import typing

    args = typing.get_args(hint)
    return [t for a in args for t in _leaf_types(a)] if args else [hint]


def test_check_command_validates_and_names_what_will_not_deploy(profiles: Path):
    ok = subprocess.run([sys.executable, "-m", "gguf_serve.catalog", "--profiles", str(profiles), "check"],
                        capture_output=True, text=True, cwd=ROOT, timeout=60)  # fmt: skip
    assert ok.returncode == 0 and "4 profiles valid" in ok.stdout
    assert re.search(r"gpu-mtp: GpuMtpStack .*\n.*\n  NOT DEPLOYABLE: Qwen3.6-27B has no pinned sha256", ok.stdout)
    edit(profiles / "serving" / "graviton-moe.toml", "parallel = 2", "parallel = 8")
    bad = subprocess.run([sys.executable, "-m", "gguf_serve.catalog", "--profiles", str(profiles), "check"],
                         capture_output=True, text=True, cwd=ROOT, timeout=60)  # fmt: skip
    assert bad.returncode == 1 and bad.stderr.startswith("error: profile 'graviton-moe'")
    assert "Traceback" not in bad.stderr
