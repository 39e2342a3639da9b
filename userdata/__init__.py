"""Boot script for serving instances, rendered per profile from a Jinja2 template."""

from userdata.render import BootSettings, DeploySettings, InstanceSpec, render_user_data

__all__ = ["BootSettings", "DeploySettings", "InstanceSpec", "render_user_data"]
