"""The unmodified E2B Python SDK's Template() builder against a real
Airlock: a build on the base template (RUN, COPY, ENV), a sandbox from it
that sees what the build made, and Template.exists for a missing name.

Run by internal/e2e/e2b_template_test.go with E2B_API_URL =
E2B_SANDBOX_URL = the server URL and E2B_API_KEY = an e2b_ key:
    python template_test.py
"""

import os
import random
import sys
import tempfile
import time

from e2b import Sandbox, Template


def main() -> int:
    if not os.environ.get("E2B_API_URL") or not os.environ.get("E2B_API_KEY"):
        print("SKIP: E2B_API_URL and E2B_API_KEY are not set")
        return 0
    run = f"{int(time.time()):x}{random.randrange(1 << 20):x}"

    assert Template.exists(f"missing-{run}") is False, "a missing template exists"
    assert Template.exists("base") is True, "base does not exist"

    ctx = tempfile.mkdtemp(prefix="e2b-template-py-")
    with open(os.path.join(ctx, "hello.txt"), "w") as f:
        f.write(f"hello from the Python SDK {run}\n")
    name = f"sdk-py-{run}"
    template = (
        Template(file_context_path=ctx)
        .from_template("base")
        .run_cmd(f"echo built-by-run-{run} > /home/user/marker")
        .copy("hello.txt", "/home/user/hello.txt")
        .set_envs({"BUILT_WITH": "e2b-py"})
    )
    logs = []
    Template.build(template, name, on_build_logs=lambda e: logs.append(str(e)))
    assert Template.exists(name) is True, "the built template does not exist"

    sbx = Sandbox.create(name, timeout=300)
    try:
        r = sbx.commands.run('cat /home/user/hello.txt /home/user/marker; echo "env=$BUILT_WITH"')
        want = f"hello from the Python SDK {run}\nbuilt-by-run-{run}\nenv=e2b-py\n"
        assert r.exit_code == 0, r
        assert r.stdout == want, f"stdout {r.stdout!r}, want {want!r}"
    finally:
        sbx.kill()
    print("ok: built", name, "and ran a sandbox from it;", len(logs), "log entries")
    return 0


if __name__ == "__main__":
    sys.exit(main())
