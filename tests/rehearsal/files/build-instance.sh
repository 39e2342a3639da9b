#!/usr/bin/env bash
# Build the fake instance's image: Debian bookworm with systemd as PID 1, Debian's Docker engine (not started:
# the user data enables it), curl, the AWS CLI, and the stand-ins for what only Amazon Linux has (dnf, the
# CloudWatch agent, cloud-init's user-data run). Runs as root on the machine whose Docker engine gets the image.
#
#   build-instance.sh TAG CA_CERT   (CA_CERT: the rehearsal's own CA, trusted like the OS's)
set -euo pipefail

tag="$1" ca_cert="$2"
here="$(cd "$(dirname "$0")" && pwd)"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
extra_ca_dir="${EXTRA_CA_DIR:-/usr/local/share/ca-certificates}"
python="${PYTHON:-python3}"
root="$(mktemp -d "${TMPDIR:-/tmp}/instance-root.XXXXXX")"
trap 'rm -rf "$root"' EXIT

packages=(systemd systemd-sysv dbus docker.io curl ca-certificates iproute2 iptables python3 python3-venv procps)
debootstrap --variant=minbase --include="$(IFS=,; echo "${packages[*]}")" bookworm "$root" "$mirror" >&2

if [[ -d "$extra_ca_dir" ]] && compgen -G "$extra_ca_dir/*.crt" >/dev/null; then
  cp "$extra_ca_dir"/*.crt "$root/usr/local/share/ca-certificates/"
fi
cp "$ca_cert" "$root/usr/local/share/ca-certificates/gguf-serve-rehearsal.crt"
chroot "$root" update-ca-certificates >&2

# The AWS CLI from pinned wheels, fetched by the host's pip (the root has no index configured).
install -d "$root/tmp/wheels"
"$python" -m pip download --quiet --no-deps -d "$root/tmp/wheels" -r "$here/instance-awscli.txt" >&2
chroot "$root" python3 -m venv /opt/awscli
chroot "$root" /opt/awscli/bin/pip install --quiet --no-index --find-links /tmp/wheels awscli==1.45.11 >&2
ln -s /opt/awscli/bin/aws "$root/usr/local/bin/aws"
rm -rf "$root/tmp/wheels"

install -m 0755 "$here/dnf" "$root/usr/local/bin/dnf"
install -d "$root/opt/rehearsal"
install -m 0644 "$here/cloudwatch_agent.py" "$root/opt/rehearsal/cloudwatch_agent.py"
install -m 0755 "$here/run-user-data" "$root/usr/local/sbin/run-user-data"
install -m 0644 "$here/run-user-data.service" "$root/etc/systemd/system/run-user-data.service"
ln -s /etc/systemd/system/run-user-data.service "$root/etc/systemd/system/multi-user.target.wants/"
install -d "$root/etc/systemd/system.conf.d"
install -m 0644 "$here/instance-environment.conf" "$root/etc/systemd/system.conf.d/rehearsal.conf"
# An AMI's Docker is installed, not running: the user data enables it.
rm -f "$root/etc/systemd/system/multi-user.target.wants/docker.service" \
  "$root/etc/systemd/system/sockets.target.wants/docker.socket"
# Nothing in a container may touch the host's consoles or clocks.
for unit in getty@tty1 systemd-timesyncd console-getty systemd-logind; do
  ln -sf /dev/null "$root/etc/systemd/system/$unit.service"
done
rm -rf "$root"/var/cache/apt/* "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* "$root"/usr/share/man/*
tar -C "$root" --numeric-owner -c . | docker import --change 'CMD ["/sbin/init"]' - "$tag" >&2
echo "$tag"
