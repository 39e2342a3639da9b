"""The deployment-profile catalog: the one place where hardware, model artifacts and llama-server settings live.

Stacks, user data, the launcher, the local runner, the benchmark and the cost model all read from here.
Standard library only: the same package runs inside the serving container.
"""

from catalog.errors import ProfileError
from catalog.hardware import HARDWARE, Architecture, Hardware
from catalog.models import MODELS, ModelArtifact
from catalog.profiles import PROFILES, ServingProfile, local_profile, profile_by_stack
from catalog.server import ServerSettings, Speculative, llama_server_args

__all__ = [
    "HARDWARE",
    "MODELS",
    "PROFILES",
    "Architecture",
    "Hardware",
    "ModelArtifact",
    "ProfileError",
    "ServerSettings",
    "ServingProfile",
    "Speculative",
    "llama_server_args",
    "local_profile",
    "profile_by_stack",
]
