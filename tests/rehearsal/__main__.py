"""python -m tests.rehearsal IMAGE GGUF: boot one fake instance with the real user data and print its steps' times."""

from __future__ import annotations

import sys
from pathlib import Path

from tests.rehearsal.harness import World


def main() -> int:
    image, gguf = sys.argv[1], Path(sys.argv[2])
    with World(image, gguf) as world:
        a = world.instance("i-0a1b2c3d4e5f60001")
        a.start()
        print(a.wait_boot_done(), flush=True)
        for t in a.step_times():
            print(f"{t.at:7.1f} s  {t.step}")
        print(a.boot_log())
        print(*a.imds.requests, sep="\n")
        print(*world.aws.recorder.calls, sep="\n")
        if "--keep" in sys.argv:
            input("press enter to tear down")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
