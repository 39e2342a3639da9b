"""CloudWatch agent stand-in: ships each `logs_collected.files.collect_list` file to CloudWatch Logs.

Reads the agent's own JSON config (what the boot script writes), resolves `{instance_id}` and the region from
the instance metadata service as the agent does in ec2 mode, and calls PutLogEvents through botocore (so the
standard AWS_ENDPOINT_URL applies). `--check CONFIG` only validates the config.
"""

import contextlib
import json
import sys
import time
import urllib.request

IMDS = "http://169.254.169.254/latest"


def metadata(path: str) -> str:
    headers = {"X-aws-ec2-metadata-token-ttl-seconds": "60"}
    put = urllib.request.Request(f"{IMDS}/api/token", method="PUT", headers=headers)  # noqa: S310
    with urllib.request.urlopen(put, timeout=5) as r:  # noqa: S310 - a fixed http:// URL
        token = r.read().decode()
    get = urllib.request.Request(f"{IMDS}/meta-data/{path}", headers={"X-aws-ec2-metadata-token": token})  # noqa: S310
    with urllib.request.urlopen(get, timeout=5) as r:  # noqa: S310
        return r.read().decode()


def collect_list(config_path: str) -> list[dict]:
    with open(config_path) as f:
        config = json.load(f)
    entries = config["logs"]["logs_collected"]["files"]["collect_list"]
    for entry in entries:
        missing = {"file_path", "log_group_name", "log_stream_name"} - set(entry)
        if missing:
            raise SystemExit(f"cloudwatch agent: {config_path}: missing {sorted(missing)}")
    return entries


def ship(entries: list[dict]) -> None:
    import botocore.session

    instance_id = metadata("instance-id")
    logs = botocore.session.get_session().create_client("logs", region_name=metadata("placement/region"))
    offsets = {}
    for entry in entries:
        entry["log_stream_name"] = entry["log_stream_name"].replace("{instance_id}", instance_id)
        with contextlib.suppress(logs.exceptions.ResourceAlreadyExistsException):
            logs.create_log_stream(logGroupName=entry["log_group_name"], logStreamName=entry["log_stream_name"])
        offsets[entry["file_path"]] = 0
    while True:
        for entry in entries:
            try:
                with open(entry["file_path"], "rb") as f:
                    f.seek(offsets[entry["file_path"]])
                    data = f.read()
            except FileNotFoundError:
                continue
            complete = data[: data.rfind(b"\n") + 1]
            lines = [line for line in complete.decode(errors="replace").splitlines() if line]
            if lines:
                now = int(time.time() * 1000)
                logs.put_log_events(
                    logGroupName=entry["log_group_name"],
                    logStreamName=entry["log_stream_name"],
                    logEvents=[{"timestamp": now, "message": line} for line in lines],
                )
            offsets[entry["file_path"]] += len(complete)
        time.sleep(1)


if __name__ == "__main__":
    if sys.argv[1] == "--check":
        collect_list(sys.argv[2])
    else:
        ship(collect_list(sys.argv[1]))
