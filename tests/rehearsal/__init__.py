"""An instance boot rehearsed on one machine: the real rendered user data in a fake instance (systemd as PID 1,
its own Docker engine), with the AWS-only services behind the seams they have in production.

See docs/rehearsal.md for what stands in for what.
"""
