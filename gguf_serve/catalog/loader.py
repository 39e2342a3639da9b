"""The profile files (profiles/*.toml) -> typed, validated catalog objects.

    profiles/hardware.toml        [ami.<name>] and [instance."<type>"]: instance types and their prices
    profiles/models.toml          ["<model>"]: the ModelScope repo and file, parameters, quantization
    profiles/models.lock.toml     written by `gguf-serve-catalog lock`: size, sha256, GGUF header facts
    profiles/serving/<name>.toml  one serving profile each: instance, model, image, [server], [fleet], stack
    profiles/workstation/<name>.toml  one GPU workstation profile each: a [workstation."<card>"] of
                                  hardware.toml, model, [server]; no stack, fleet or price (gguf-serve-workstation)
    profiles/sagemaker.toml       [hosting."<EC2 type>"]: the ml type of each EC2 type's SageMaker twin;
                                  [endpoint_type."<ml type>"]: ml types of the endpoint profiles
    profiles/sagemaker/<name>.toml  one SageMaker endpoint profile each, a serving profile whose instance_type is
                                  an [endpoint_type.*] (a SageMaker stack of its own, no EC2 twin)
    profiles/sagemaker-hosted.toml  the ml types SageMaker hosts per region (pinned, with its source)

Every error names the file and key and says what to write instead; a profile that cannot work is refused with
the same messages as gguf_serve.catalog.profiles' validation (memory fit, architecture, MTP, threads, slots, GPU).
"""

from __future__ import annotations

import contextlib
import json
import tomllib
import types
import typing
from dataclasses import MISSING, dataclass, field, fields
from dataclasses import replace as dataclass_replace
from pathlib import Path
from typing import Any

from gguf_serve.catalog import limits, model_facts
from gguf_serve.catalog.errors import ProfileError
from gguf_serve.catalog.fleet import FleetSettings
from gguf_serve.catalog.hardware import Architecture, Hardware
from gguf_serve.catalog.hosting import HostedTypes, SageMakerHosting
from gguf_serve.catalog.images import IMAGE_TARGETS, ImageTarget
from gguf_serve.catalog.lockfile import LockedModel, read_lock
from gguf_serve.catalog.memory import fit_on, plan_memory, smallest_fit, suggest_card
from gguf_serve.catalog.models import ModelArtifact
from gguf_serve.catalog.names import HUB_SHAPES
from gguf_serve.catalog.profiles import ServingProfile
from gguf_serve.container.server import ALL_LAYERS, ServerSettings, Speculative

PROFILES_DIR = Path(__file__).resolve().parents[2] / "profiles"
LOCK_NAME = "models.lock.toml"


@dataclass(frozen=True)
class Catalog:
    hardware: dict[str, Hardware]
    models: dict[str, ModelArtifact]
    locks: dict[str, LockedModel]
    profiles: dict[str, ServingProfile]
    root: Path
    lock_file: Path
    workstations: dict[str, Hardware] = field(default_factory=dict)  # [workstation."<card>"]: GPU machines
    workstation_profiles: dict[str, ServingProfile] = field(
        default_factory=dict
    )  # profiles/workstation/*.toml; never stacks
    unlocked: dict[str, str] = field(default_factory=dict)  # skip_unlocked: profile file -> its model, not locked
    unlocked_frames: dict[str, ProfileFrame] = field(default_factory=dict)  # skip_unlocked: stack -> its frame
    problems: dict[str, str] = field(default_factory=dict)  # tolerant: profile file or "model <name>" -> why not
    hosting: dict[str, SageMakerHosting] = field(default_factory=dict)  # profiles/sagemaker.toml, by EC2 type
    endpoint_types: dict[str, SageMakerHosting] = field(default_factory=dict)  # [endpoint_type.*], by ml type
    endpoint_profiles: dict[str, ServingProfile] = field(default_factory=dict)  # profiles/sagemaker/, by name
    hosted: HostedTypes = field(default_factory=lambda: HostedTypes("", {}))  # profiles/sagemaker-hosted.toml

    def profile_by_stack(self, stack_name: str) -> ServingProfile:
        for p in self.profiles.values():
            if p.stack_name == stack_name:
                return p
        stacks = [p.stack_name for p in self.profiles.values() if p.stack_name]
        raise ProfileError(f"no profile for stack {stack_name!r}: use one of {stacks}")


def load_catalog(
    root: Path = PROFILES_DIR,
    *,
    lock_file: Path | None = None,
    skip_unlocked: bool = False,
    tolerant: bool = False,
    workstations: bool = True,
    locks: dict[str, LockedModel] | None = None,
) -> Catalog:
    """skip_unlocked: a profile whose model has no lock entry at all is left out (named in `unlocked`) instead of
    refused; the app refuses just its stack, and builds the others.
    tolerant: a model or profile that fails is left out and its reason kept in `problems` (a model's reason for
    each profile that names it), instead of failing the whole catalog. workstations: load profiles/workstation/.
    locks: these entries instead of the lock file's (a lock not written yet, checked before it is)."""
    if not root.is_dir():
        raise ProfileError(f"no profile folder at {root}: the catalog's data lives in profiles/ at the repo root")
    lock_file = lock_file or root / LOCK_NAME
    hardware = load_hardware(root / "hardware.toml")
    locks = read_lock(lock_file) if locks is None else locks
    problems: dict[str, str] | None = {} if tolerant else None
    models = load_models(root / "models.toml", locks, lock_file, problems)
    profiles = {}
    stacks: dict[str, Path] = {}
    unlocked: dict[str, str] = {}
    frames: dict[str, ProfileFrame] = {}
    declared_models = _toml(root / "models.toml")
    for path in sorted((root / "serving").glob("*.toml")):
        if skip_unlocked and (model := _unlocked_model(path, declared_models, models, problems)):
            unlocked[str(path)] = model
            frame = _tolerate(problems, path, lambda path=path: load_frame(path, hardware=hardware))
            if frame is not None and frame.stack_name:
                frames[frame.stack_name] = frame
            continue
        p = _tolerate(problems, path, lambda path=path: load_profile(path, hardware=hardware, models=models))
        if p is None:
            continue
        if p.stack_name and p.stack_name in stacks:
            raise ProfileError(f"{path}: stack {p.stack_name!r} is already {stacks[p.stack_name]}'s; pick another")
        stacks[p.stack_name] = path
        profiles[p.name] = p
    cards = load_workstations(root / "hardware.toml") if workstations else {}
    workstation_profiles = {}
    for path in sorted((root / "workstation").glob("*.toml")) if workstations else ():
        if not (skip_unlocked and _unlocked_model(path, declared_models, models, problems)):
            w = _tolerate(problems, path, lambda path=path: load_workstation_profile(path, cards=cards, models=models))
            if w is not None:
                workstation_profiles[path.stem] = w
    hosting, endpoint_types = (
        load_hosting(root / "sagemaker.toml", hardware) if (root / "sagemaker.toml").exists() else ({}, {})
    )
    endpoint_hw = {t: h.own_hardware() for t, h in endpoint_types.items()}
    endpoint_profiles = {}
    for path in sorted((root / "sagemaker").glob("*.toml")) if endpoint_types else ():
        if skip_unlocked and _unlocked_model(path, declared_models, models, problems):
            continue  # its model's own refusal stands for it (the app plans every model)
        p = _tolerate(problems, path, lambda path=path: load_profile(path, hardware=endpoint_hw, models=models))
        if p is None:
            continue
        if not p.stack_name.endswith("SageMakerStack") or p.stack_name in stacks:
            raise ProfileError(f"{path}: stack {p.stack_name!r} must be new and end in SageMakerStack")
        stacks[p.stack_name] = path
        endpoint_profiles[p.name] = p
    hosted = load_hosted(root / "sagemaker-hosted.toml") if (root / "sagemaker-hosted.toml").exists() else None
    return Catalog(hardware, models, locks, profiles, root, lock_file, cards, workstation_profiles, unlocked, frames,
                   problems or {}, hosting, endpoint_types, endpoint_profiles,
                   hosted or HostedTypes("", {}))  # fmt: skip


def _tolerate(problems: dict[str, str] | None, path: Path, load: Any) -> Any:
    """load(), or (tolerant) None with the reason kept: the model's own when the profile's model failed."""
    if problems is None:
        return load()
    try:
        return load()
    except ProfileError as e:
        with contextlib.suppress(ProfileError):
            model = _toml(path).get("model")
            e = ProfileError(problems.get(f"model {model}", str(e)))
        problems[str(path)] = str(e)
        return None


def _unlocked_model(
    path: Path, declared: dict[str, Any], models: dict[str, ModelArtifact], problems: dict[str, str] | None = None
) -> str:
    """The model a profile file names when it is declared but has no lock entry yet, else ''."""
    model = _toml(path).get("model")
    failed = problems is not None and f"model {model}" in problems  # locked but broken: a problem, not unlocked
    return model if isinstance(model, str) and model in declared and model not in models and not failed else ""


# --- files -------------------------------------------------------------------------------------------------------


def _toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ProfileError(f"{path} is missing") from None
    except tomllib.TOMLDecodeError as e:
        raise ProfileError(f"{path}: not valid TOML ({e})") from None


def _where(path: Path, *keys: str) -> str:
    return f"{path}: " + ".".join(k if k.replace("_", "").replace("-", "").isalnum() else json.dumps(k) for k in keys)


def _table(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ProfileError(f"{where} must be a table ([...]), got {value!r}")
    return value


def load_hardware(path: Path) -> dict[str, Hardware]:
    doc = _toml(path)
    _only(doc, {"ami", "instance", "workstation"}, _where(path, "(top level)"))
    amis = _table(doc.get("ami", {}), _where(path, "ami"))
    out = {}
    for name, table in _table(doc.get("instance", {}), _where(path, "instance")).items():
        where = _where(path, "instance", name)
        table = dict(_table(table, where))
        ami_name = table.pop("ami", None)
        if not isinstance(ami_name, str) or ami_name not in amis:
            raise ProfileError(f"{where}: ami must name one of [ami.*] ({', '.join(sorted(amis))}), got {ami_name!r}")
        ami = _table(amis[ami_name], _where(path, "ami", ami_name))
        _only(ami, {"ssm_parameter", "root_snapshot_gib"}, _where(path, "ami", ami_name))
        _check_ami(ami, _where(path, "ami", ami_name))
        table["ami_ssm_parameter"] = ami.get("ssm_parameter")
        table["ami_root_snapshot_gib"] = ami.get("root_snapshot_gib")
        if "architecture" in table:
            table["architecture"] = _enum(Architecture, table["architecture"], f"{where}.architecture")
        out[name] = _build(Hardware, {"instance_type": name, **table}, where,
                           skip={"instance_type", "ami_ssm_parameter", "ami_root_snapshot_gib"})  # fmt: skip
        _check_hardware(out[name], where)
    return out


_ENDPOINT_ONLY = {"architecture", "estimated_tok_s", "estimate_basis"}  # an endpoint type's; a twin has its EC2's


def load_hosting(
    path: Path, hardware: dict[str, Hardware]
) -> tuple[dict[str, SageMakerHosting], dict[str, SageMakerHosting]]:
    """[hosting."<EC2 type>"] tables: the SageMaker ml type each serving EC2 type runs on (stacks/sagemaker/), by EC2
    type; [endpoint_type."<ml type>"] tables: the ml types endpoint profiles name, by ml type."""
    doc = _toml(path)
    _only(doc, {"hosting", "endpoint_type"}, _where(path, "(top level)"))
    twins, endpoint_types = {}, {}
    for ec2_type, table in _table(doc.get("hosting", {}), _where(path, "hosting")).items():
        where = _where(path, "hosting", ec2_type)
        _pick(hardware, ec2_type, "instance type", where, "profiles/hardware.toml")
        values = {k: tuple(v) if isinstance(v, list) else v for k, v in _table(table, where).items()}
        _only(values, {f.name for f in fields(SageMakerHosting)} - _ENDPOINT_ONLY - {"ec2_type"}, where)
        twins[ec2_type] = _check_hosting(_build(SageMakerHosting, {"ec2_type": ec2_type, **values}, where), where)
    for ml_type, table in _table(doc.get("endpoint_type", {}), _where(path, "endpoint_type")).items():
        where = _where(path, "endpoint_type", ml_type)
        values = {"ec2_type": "", "ml_type": ml_type, **_table(table, where)}
        _enum(Architecture, values.get("architecture"), f"{where}.architecture")
        if not isinstance(values.get("estimated_tok_s"), int | float) or not values.get("estimate_basis"):
            raise ProfileError(f"{where}: an endpoint type states estimated_tok_s and its estimate_basis (one line)")
        endpoint_types[ml_type] = _check_hosting(_build(SageMakerHosting, values, where), where)
    return twins, endpoint_types


def _check_hosting(hosting: SageMakerHosting, where: str) -> SageMakerHosting:
    if not hosting.ml_type.startswith("ml.") or hosting.physical_cores > hosting.vcpus:
        raise ProfileError(f"{where}: ml_type must be an ml.* type and physical_cores at most vcpus")
    return hosting


def load_hosted(path: Path) -> HostedTypes:
    """profiles/sagemaker-hosted.toml: source = "...", then ["<region>"] hosted = [<ml type>, ...]."""
    doc = _toml(path)
    source = doc.get("source")
    if not isinstance(source, str) or not source:
        raise ProfileError(f"{path}: source is missing: say where the lists come from")
    regions = {}
    for region, table in doc.items():
        if region == "source":
            continue
        where = _where(path, region)
        hosted = _table(table, where).get("hosted")
        if not isinstance(hosted, list) or not all(isinstance(t, str) and t.startswith("ml.") for t in hosted):
            raise ProfileError(f"{where}.hosted must be a list of ml.* types")
        regions[region] = frozenset(hosted)
    return HostedTypes(source, regions)


def _check_ami(ami: dict[str, Any], where: str) -> None:
    param, snapshot = ami.get("ssm_parameter"), ami.get("root_snapshot_gib")
    if not isinstance(param, str) or not param.startswith("/"):
        raise ProfileError(f"{where}.ssm_parameter: {param!r} is not an SSM parameter name; allowed: a name like "
                           "/aws/service/...")  # fmt: skip
    if not _is(snapshot, int) or not 1 <= snapshot <= 16384:
        raise ProfileError(f"{where}.root_snapshot_gib: {snapshot!r} is not a snapshot size; allowed: an integer "
                           "from 1 to 16,384 GiB (gp3's largest volume)")  # fmt: skip


def _check_hardware(hw: Hardware, where: str) -> None:
    if hw.physical_cores > hw.vcpus:
        raise ProfileError(f"{where}.physical_cores: {hw.physical_cores} is more than vcpus ({hw.vcpus}); "
                           f"allowed: 1 to {hw.vcpus}")  # fmt: skip
    if hw.host_reserve_gib >= hw.memory_gib:
        raise ProfileError(f"{where}.host_reserve_gib: {hw.host_reserve_gib} leaves nothing of memory_gib "
                           f"({hw.memory_gib}); allowed: less than memory_gib")  # fmt: skip
    if hw.has_gpu and hw.gpu_memory_gib <= 0:
        raise ProfileError(f"{where}.gpu_memory_gib: {hw.gpu_memory_gib} for a GPU ({hw.gpu}); allowed: more than 0")


_WORKSTATION_KEYS = {"gpu", "gpu_memory_gib", "memory_gib", "vcpus", "physical_cores", "cpu", "architecture",
                     "host_reserve_gib"}  # fmt: skip


def load_workstations(path: Path) -> dict[str, Hardware]:
    """[workstation."<card>"]: one GPU machine each (the card, and the RAM and cores of the box it sits in).

    No AMI, stack, fleet or price: a workstation is bought, not launched. Its RAM is an input of the fit (it holds
    the experts --n-cpu-moe keeps on the CPU); a workstation profile may override it with host_memory_gib.
    """
    doc = _toml(path)
    out = {}
    instances = _table(doc.get("instance", {}), _where(path, "instance"))
    for name, table in _table(doc.get("workstation", {}), _where(path, "workstation")).items():
        where = _where(path, "workstation", name)
        table = {"architecture": "x86_64", **_table(table, where)}
        if name in instances:
            raise ProfileError(f"{where}: {name!r} is also an [instance.*]; give the workstation another name")
        _only(table, _WORKSTATION_KEYS, where)
        if not isinstance(table.get("gpu"), str):
            raise ProfileError(f"{where}: gpu is missing or not a string (a workstation is a GPU machine)")
        table["architecture"] = _enum(Architecture, table["architecture"], f"{where}.architecture")
        values = {"instance_type": name, "ami_ssm_parameter": "", "ami_root_snapshot_gib": 0, **table}
        injected = {"instance_type", "ami_ssm_parameter", "ami_root_snapshot_gib"}
        out[name] = _build(Hardware, values, where, skip=injected)
        _check_hardware(out[name], where)
    return out


_DECLARED_MODEL = {"repo", "file", "revision", "quantization", "total_params_b", "active_params_b", "aliases"}


def load_models(
    path: Path, locks: dict[str, LockedModel], lock_file: Path, problems: dict[str, str] | None = None
) -> dict[str, ModelArtifact]:
    """Every declared model that has a lock entry; with `problems`, one that fails is left out, its reason kept."""
    out = {}
    for name, table in _toml(path).items():
        model = _tolerate(
            problems, path, lambda name=name, table=table: _load_model(path, name, table, locks, lock_file)
        )
        if problems is not None and str(path) in problems:
            problems[f"model {name}"] = problems.pop(str(path))
        if model is not None:
            out[name] = model
    return out


def _load_model(
    path: Path, name: str, table: Any, locks: dict[str, LockedModel], lock_file: Path
) -> ModelArtifact | None:
    where = _where(path, name)
    declared = {"revision": "master", **_table(table, where)}
    _only(declared, _DECLARED_MODEL, where)
    if not HUB_SHAPES["name"][0](name):
        raise ProfileError(f"{where}: model name {name!r} is not allowed; allowed: {HUB_SHAPES['name'][1]}")
    for key in ("repo", "file", "revision"):  # before the lock is compared with them: refused as themselves
        limits.check(ModelArtifact, key, declared.get(key), where)
    lock = locks.get(name)
    if lock is None:
        return None  # declared, not locked yet: a profile that uses it is refused with what to run
    if (lock.repo, lock.file, lock.revision) != (declared.get("repo"), declared.get("file"), declared["revision"]):
        raise ProfileError(
            f"{lock_file}: {name!r} was locked for {lock.repo}/{lock.file}@{lock.revision} but {path} "
            f"declares {declared.get('repo')}/{declared.get('file')}@{declared['revision']}; "
            f"run `gguf-serve-catalog lock {name}`"
        )
    facts = lock.header
    lock_where = _where(lock_file, name, "gguf")
    values = {
        **declared,
        "name": name,
        "size_bytes": lock.size_bytes,
        "sha256": lock.sha256,
        # Only a listing's commit is fetched by instances; a typed entry has none, and fetches its revision.
        "commit": lock.commit if lock.locked_from == "listing" else None,
        "gguf_architecture": facts["architecture"],
        "has_mtp_layers": model_facts.mtp_layers(facts) > 0,
        "kv_bytes_per_token": model_facts.kv_bytes_per_token(facts, lock_where),
        "recurrent_state_bytes_per_slot": model_facts.recurrent_state_bytes(facts, lock_where),
        "expert_bytes_per_layer": tuple(
            lock.tensors.get("expert_bytes")
            or model_facts.estimated_expert_bytes(facts, lock.size_bytes, declared.get("total_params_b", 0), lock_where)
        ),
    }
    aliases = values.get("aliases", [])
    if not isinstance(aliases, list) or not all(isinstance(a, str) and HUB_SHAPES["name"][0](a) for a in aliases):
        raise ProfileError(f"{where}.aliases: must be a list of names; allowed: {HUB_SHAPES['name'][1]}")
    values["aliases"] = tuple(aliases)
    model = _build(ModelArtifact, values, where, skip={"name", *values} - _DECLARED_MODEL)
    active, total = model.active_params_b, model.total_params_b
    if active > total:
        raise ProfileError(f"{where}.active_params_b: {active} is more than total_params_b ({total}); "
                           "allowed: at most total_params_b (less means MoE)")  # fmt: skip
    return model


_PROFILE_KEYS = {"stack", "instance_type", "model", "image", "description", "server", "fleet"}


@dataclass(frozen=True)
class ProfileFrame:
    """A serving profile file without its model: what its stack asks of an account, known before the model is
    locked (the pre-flight plans an unlocked stack from it)."""

    name: str
    stack_name: str
    hardware: Hardware
    image: ImageTarget
    fleet: FleetSettings


def load_frame(path: Path, *, hardware: dict[str, Hardware]) -> ProfileFrame:
    doc = _toml(path)
    name = _profile_name(path)
    where = f"{path}"
    _only(doc, _PROFILE_KEYS, where)
    for key in ("instance_type", "model", "image"):
        if not isinstance(doc.get(key), str):
            raise ProfileError(f"{where}: {key} is missing or not a string")
    stack = doc.get("stack", "")
    if not isinstance(stack, str) or (stack and not (stack.isascii() and stack.isalnum() and stack[0].isalpha())):
        raise ProfileError(f"{where}: stack must be a CloudFormation stack name of letters and digits, got {stack!r}")
    hw = _pick(hardware, doc["instance_type"], "instance type", f"{where}: instance_type", "profiles/hardware.toml")
    image = _pick(IMAGE_TARGETS, doc["image"], "image target", f"{where}: image", "gguf_serve/catalog/images.py")
    fleet = load_fleet(doc.get("fleet", {}), f"{where}: fleet")
    return ProfileFrame(name=name, stack_name=stack, hardware=hw, image=image, fleet=fleet)


def load_profile(path: Path, *, hardware: dict[str, Hardware], models: dict[str, ModelArtifact]) -> ServingProfile:
    frame = load_frame(path, hardware=hardware)
    doc = _toml(path)
    where = f"{path}"
    if doc["model"] not in models:
        raise ProfileError(
            f"{where}: model {doc['model']!r} is not locked: declare it in profiles/models.toml and run "
            f"`gguf-serve-catalog lock {doc['model']}` (locked: {', '.join(sorted(models)) or 'none'})"
        )
    server_doc = dict(_table(doc.get("server", {}), f"{where}: server"))
    spec = server_doc.pop("speculative", None)
    if spec is not None:
        server_doc["speculative"] = _build(Speculative, _table(spec, f"{where}: server.speculative"),
                                           f"{where}: server.speculative")  # fmt: skip
    if server_doc.get("gpu_layers") == "all":
        server_doc["gpu_layers"] = ALL_LAYERS
    auto = server_doc.get("n_cpu_moe") == "auto"
    if auto or server_doc.get("n_cpu_moe") == "all":
        server_doc["n_cpu_moe"] = 0 if auto else ALL_LAYERS
    server = _build(ServerSettings, server_doc, f"{where}: server", skip={"speculative"})
    model = models[doc["model"]]
    if auto and server.gpu_layers > 0 and model.expert_bytes_per_layer:
        # the fewest blocks whose experts stay in host RAM for the rest to fit the GPU (as on a workstation)
        fit = smallest_fit(model, server, frame.hardware)
        if not fit.fits:
            raise ProfileError(f"{where}: {_refusal(model, server, frame.hardware, fit, {}, plan_memory)}")
        server = dataclass_replace(server, n_cpu_moe=fit.n_cpu_moe)
    description = doc.get("description", "")
    if not isinstance(description, str):
        raise ProfileError(f"{where}: description must be a string")
    where_types = f"{where}: fleet.spot_instance_types"
    _check_spot_types(frame.fleet, frame.hardware, hardware, models[doc["model"]], where_types)
    return ServingProfile(
        name=frame.name,
        stack_name=frame.stack_name,
        hardware=frame.hardware,
        model=model,
        server=server,
        image=frame.image,
        fleet=frame.fleet,
        description=description,
    )


# [fleet] keys that are deploy options: synth always took deploy.toml or -c for them, never the profile's value.
_DEPLOY_OPTION_KEYS = {"spot": "spot", "off_hours": "offHours", "allowed_cidrs": "allowedCidrs",
                       "wake_on_request": "wakeOnRequest"}  # fmt: skip


def load_fleet(value: Any, where: str) -> FleetSettings:
    """A profile's flat [fleet] table -> FleetSettings, each key checked in the part that holds it."""
    table = _table(value, where)
    for key, option in _DEPLOY_OPTION_KEYS.items():
        if key in table:
            raise ProfileError(f"{where}.{key}: a deploy option, the same for every stack of a deploy; remove it "
                               f"here and set {option} in deploy.toml (or -c {option}=...)")  # fmt: skip
    parts = {name: {f.name for f in fields(part)} for name, part in FleetSettings.parts().items()}
    _only(table, set().union(*parts.values()), where)
    table = {k: tuple(v) if isinstance(v, list) else v for k, v in table.items()}  # spot_instance_types
    fleet = FleetSettings(**{
        name: _build(FleetSettings.parts()[name], {k: v for k, v in table.items() if k in keys}, where)
        for name, keys in parts.items()
    })  # fmt: skip
    _check_fleet(fleet, where)
    return fleet


def _profile_name(path: Path) -> str:
    """A profile is named by its file: the name reaches an instance's boot script, so it holds hub characters only."""
    test, allowed = HUB_SHAPES["name"]
    if not test(path.stem):
        raise ProfileError(f"{path}: the profile name {path.stem!r} (the file's name) is not allowed; rename the file "
                           f"({allowed})")  # fmt: skip
    return path.stem


def _check_fleet(f: FleetSettings, where: str) -> None:
    """Keys that bound each other; the message names the other key."""
    c = f.capacity
    pairs = [
        ("min_capacity", c.min_capacity, "max_capacity", c.max_capacity),
        ("warm_pool_size", c.warm_pool_size, "max_capacity", c.max_capacity),
        ("nat_gateways", f.network.nat_gateways, "max_azs", f.network.max_azs),
    ]
    if c.desired_capacity is not None:
        pairs.append(("desired_capacity", c.desired_capacity, "max_capacity", c.max_capacity))
    for key, value, other, bound in pairs:
        if value > bound:
            raise ProfileError(f"{where}.{key}: {value} is more than {other} ({bound}); allowed: 0 to {other}")
    if c.desired_capacity is not None and c.desired_capacity < c.min_capacity:
        raise ProfileError(f"{where}.desired_capacity: {c.desired_capacity} is less than min_capacity "
                           f"({c.min_capacity}); allowed: min_capacity to max_capacity")  # fmt: skip


def _check_spot_types(f: FleetSettings, hw: Hardware, hardware: dict[str, Hardware], model: Any, where: str) -> None:
    """Each Spot alternative runs the same image and runtime spec as the profile's type, and holds its memory plan."""
    for name in f.capacity.spot_instance_types:
        alt = _pick(hardware, name, "instance type", where, "profiles/hardware.toml")
        same = (alt.architecture, alt.vcpus, alt.physical_cores, alt.has_gpu)
        if same != (hw.architecture, hw.vcpus, hw.physical_cores, hw.has_gpu):
            raise ProfileError(
                f"{where}: {name} ({alt.architecture.value}, {alt.vcpus} vCPUs, {alt.physical_cores} cores) is not "
                f"shaped like {hw.instance_type} ({hw.architecture.value}, {hw.vcpus} vCPUs, {hw.physical_cores} "
                "cores): every type of the group runs the same image and runtime spec; pick one of the same shape"
            )
        if alt.memory_gib - alt.host_reserve_gib < hw.memory_gib - hw.host_reserve_gib:
            raise ProfileError(
                f"{where}: {name} has {alt.memory_gib} GiB of memory, less than {hw.instance_type}'s "
                f"{hw.memory_gib} GiB that {model.name}'s memory plan was checked against; pick a type with as much"
            )


_WORKSTATION_PROFILE_KEYS = {"workstation", "model", "image", "description", "host_memory_gib", "server"}


def load_workstation_profile(
    path: Path, *, cards: dict[str, Hardware], models: dict[str, ModelArtifact]
) -> ServingProfile:
    """profiles/workstation/<name>.toml -> a ServingProfile on a [workstation.*] machine, n_cpu_moe resolved.

    [server] as in a serving profile, with gpu_layers "all" by default and n_cpu_moe = "auto" (default: the
    fewest blocks whose experts must stay in host RAM for the rest to fit the card), "all" (--cpu-moe) or N.
    """

    doc = _toml(path)
    where = f"{path}"
    if "stack" in doc or "fleet" in doc:
        raise ProfileError(f"{where}: a workstation profile is never a stack; put stacks in profiles/serving/")
    _only(doc, _WORKSTATION_PROFILE_KEYS, where)
    for key in ("workstation", "model"):
        if not isinstance(doc.get(key), str):
            raise ProfileError(f"{where}: {key} is missing or not a string")
    hw = _pick(cards, doc["workstation"], "workstation", f"{where}: workstation", "profiles/hardware.toml")
    if "host_memory_gib" in doc:
        if not _is(doc["host_memory_gib"], float) or doc["host_memory_gib"] <= 0:
            raise ProfileError(f"{where}: host_memory_gib must be a positive number, got {doc['host_memory_gib']!r}")
        hw = dataclass_replace(hw, memory_gib=float(doc["host_memory_gib"]))
    if doc["model"] not in models:
        raise ProfileError(
            f"{where}: model {doc['model']!r} is not locked: declare it in profiles/models.toml and run "
            f"`gguf-serve-catalog lock {doc['model']}` (locked: {', '.join(sorted(models)) or 'none'})"
        )
    model = models[doc["model"]]
    image = _pick(
        IMAGE_TARGETS, doc.get("image", "cuda"), "image target", f"{where}: image", "gguf_serve/catalog/images.py"
    )
    server_doc = {"gpu_layers": "all", "n_cpu_moe": "auto", **_table(doc.get("server", {}), f"{where}: server")}
    spec = server_doc.pop("speculative", None)
    if spec is not None:
        server_doc["speculative"] = _build(Speculative, _table(spec, f"{where}: server.speculative"),
                                           f"{where}: server.speculative")  # fmt: skip
    if server_doc["gpu_layers"] == "all":
        server_doc["gpu_layers"] = ALL_LAYERS
    auto = server_doc["n_cpu_moe"] == "auto"
    if auto or server_doc["n_cpu_moe"] == "all":
        server_doc["n_cpu_moe"] = ALL_LAYERS if server_doc["n_cpu_moe"] == "all" else 0
    server = _build(ServerSettings, server_doc, f"{where}: server", skip={"speculative"})
    if server.gpu_layers > 0:
        fit = smallest_fit(model, server, hw) if auto and model.expert_bytes_per_layer else fit_on(model, server, hw)
        if not fit.fits:
            raise ProfileError(f"{where}: {_refusal(model, server, hw, fit, cards, plan_memory)}; "
                               f"{suggest_card(model, server, cards, but=hw.instance_type)}")  # fmt: skip
        server = dataclass_replace(server, n_cpu_moe=fit.n_cpu_moe)
    description = doc.get("description", "")
    if not isinstance(description, str):
        raise ProfileError(f"{where}: description must be a string")
    return ServingProfile(
        name=_profile_name(path),
        stack_name="",
        hardware=hw,
        model=model,
        server=server,
        image=image,
        description=description,
    )


def _refusal(model: ModelArtifact, server: ServerSettings, hw: Hardware, fit: Any, cards: Any, plan: Any) -> str:
    """What does not fit, with the arithmetic: GPU memory first, then the host RAM the CPU-side experts need."""
    if fit.gpu_need_gib > fit.gpu_gib:
        gpu_plan = plan(model, dataclass_replace(server, n_cpu_moe=fit.n_cpu_moe), reserve_gib=None)
        parts = ", ".join(f"{k} {v:.1f}" for k, v in gpu_plan.items() if k not in ("prompt_cache", "cpu_experts"))
        flag = f" with {fit.flag}" if fit.n_cpu_moe else ""
        return (f"{model.name} needs {fit.gpu_need_gib:.1f} GiB of GPU memory{flag} ({parts}) but {hw.instance_type} "
                f"({hw.gpu}) has {fit.gpu_gib:.1f} GiB")  # fmt: skip
    return (
        f"{model.name} fits {hw.instance_type}'s {fit.gpu_gib:.1f} GiB of GPU memory only with {fit.flag}, which "
        f"needs {fit.host_need_gib:.1f} GiB of host RAM (experts, prompt cache, reserve) but it has "
        f"{fit.host_gib:.1f} GiB; lower cache_ram_mib or add RAM (host_memory_gib)"
    )


# --- typed fields ------------------------------------------------------------------------------------------------


def _pick(table: dict[str, Any], key: str, what: str, where: str, file: str) -> Any:
    if key not in table:
        raise ProfileError(f"{where}: unknown {what} {key!r}: use one of {', '.join(sorted(table))} ({file})")
    return table[key]


def _enum(kind: type, value: Any, where: str) -> Any:
    try:
        return kind(value)
    except ValueError:
        raise ProfileError(f"{where} must be one of {[m.value for m in kind]}, got {value!r}") from None  # type: ignore[attr-defined]


def _only(doc: dict[str, Any], known: set[str], where: str) -> None:
    unknown = sorted(set(doc) - known)
    if unknown:
        raise ProfileError(f"{where}: unknown key {unknown[0]!r}; known keys: {', '.join(sorted(known))}")


def _build(cls: type, values: dict[str, Any], where: str, *, skip: set[str] = frozenset()) -> Any:  # type: ignore[assignment]
    """cls(**values), each value checked against the field's type; unknown, missing and mistyped keys named."""
    hints = typing.get_type_hints(cls)
    known = {f.name: f for f in fields(cls)}
    _only(values, set(known), where)
    for name, f in known.items():
        if name not in values:
            if f.default is MISSING and f.default_factory is MISSING:
                raise ProfileError(f"{where}: missing key {name!r} ({_type_name(hints[name])})")
            continue
        if name not in skip and not _is(values[name], hints[name]):
            got = f"{values[name]!r} ({type(values[name]).__name__})"
            raise ProfileError(f"{where}: {name} must be {_type_name(hints[name])}, got {got}")
        if name not in skip:
            limits.check(cls, name, values[name], where)
    return cls(**values)


def _is(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        return any(_is(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if origin is tuple:
        args = typing.get_args(hint)
        item = args[0]
        return isinstance(value, tuple) and all(_is(v, item) for v in value)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True


def _type_name(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        return " or ".join(_type_name(h) for h in typing.get_args(hint) if h is not type(None)) + " (or leave it out)"
    if origin is tuple:
        return f"a list of {_type_name(typing.get_args(hint)[0])}"
    names = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}
    return names.get(hint, getattr(hint, "__name__", str(hint)))
