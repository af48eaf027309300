"""Rolling restart of three `inferd serve` replicas behind HAProxy under continuous streaming load.

    python bench/rolling_restart.py [--model PATH] [--concurrency 12] [--max-tokens 64] [--users 24]
                                    [--warmup 20] [--settle 20] [--threads 1]

Runs the shipped config/haproxy/inferd.cfg unchanged except for its loopback ports (health checks every 1 s,
2 failures to go down, 2 successes to come back) and replicas with `--drain-delay-s 5 --drain-timeout-s 30`, as
that file recommends. `concurrency` closed-loop clients stream /v1/completions (max_tokens each, ignore_eos,
users hashed onto replicas by the `user` field) the whole time; after `warmup` s every replica in turn gets
SIGTERM, is waited for, started again and waited for until HAProxy has it UP; `settle` s more, then the load
stops. Counts failed requests and truncated streams (see tests/ops/load.py) and the throughput before, during
and after the rolling restart, and writes bench/results/rolling_restart.md. The default model is SmolLM2-135M
(the test suite's tiny model is too fast for the replicas, not the load generator, to be the limit).
"""
from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

# after the sys.path line above: tests/ is imported from the repository root
from tests.ops.load import rolling_restart, summary_rows, wait_up  # noqa: E402
from tests.ops.procs import (  # noqa: E402
    APT_HINT,
    HAProxy,
    Replica,
    binary,
    free_port,
    haproxy_config,
)


def default_model() -> str:
    cached = Path.home() / ".cache" / "inferd-test-models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if cached.exists():
        return str(cached)
    from inferd.model.pull import DEFAULT_MODEL, resolve
    return str(resolve(DEFAULT_MODEL, progress=False))


async def run(args: argparse.Namespace, work: Path):
    options = ("--served-model-name", "bench", "--threads", str(args.threads), "--kv-cache-mib", "256",
               "--no-measure-bandwidth", "--no-log-requests", "--drain-delay-s", "5", "--drain-timeout-s", "30")
    replicas = [Replica(args.model, free_port(), work, *options, name=f"r{i + 1}") for i in range(3)]
    sock, lb_port = work / "stats.sock", free_port()
    haproxy = HAProxy(haproxy_config(lb_port, [r.port for r in replicas], sock, free_port()), work, sock)
    try:
        for r in replicas:
            r.start()
        for r in replicas:
            await asyncio.to_thread(r.wait_ready)
        haproxy.start()
        for r in replicas:
            await wait_up(haproxy, r.name, 30)
        return await rolling_restart(replicas, haproxy, f"http://127.0.0.1:{lb_port}", concurrency=args.concurrency,
                                     max_tokens=args.max_tokens, users=args.users, warmup_s=args.warmup,
                                     settle_s=args.settle, drain_timeout_s=30)
    finally:
        haproxy.stop()
        for r in replicas:
            r.stop()


def markdown(report, args: argparse.Namespace, model: str) -> str:
    rows = "\n".join(f"| {k} | {v} |" for k, v in summary_rows(report))
    marks = {int(r.sigterm_at): r.name for r in report.restarts}
    timeline = " ".join(f"[{marks[i]}]{n}" if i in marks else str(n) for i, n in enumerate(report.per_second))
    return f"""# Rolling restart behind HAProxy under streaming load

`python bench/rolling_restart.py --concurrency {args.concurrency} --max-tokens {args.max_tokens} --users {args.users} \
--warmup {args.warmup:g} --settle {args.settle:g} --threads {args.threads}` on {time.strftime('%Y-%m-%d')}.

Three `inferd serve` replicas of `{Path(model).name}` ({args.threads} compute thread each, `--drain-delay-s 5
--drain-timeout-s 30`) behind HAProxy 2.6 running the shipped `config/haproxy/inferd.cfg` (only its loopback ports
changed: checks every 1 s, 2 failures down, 2 successes up). {args.concurrency} closed-loop clients stream
`/v1/completions` ({args.max_tokens} tokens each, `ignore_eos`, {args.users} users hashed onto replicas by `user`)
throughout; each replica in turn gets SIGTERM, exits, starts again and rejoins when HAProxy marks it UP.

The machine was shared: 2 CPU cores with other builds and tests running, so absolute throughput is
noisy; the three replicas, HAProxy and the Python load generator all share those 2 cores, so throughput while one
replica is away is not simply two thirds of the full figure.

| | |
| --- | --- |
{rows}

A stream counts as complete when it answered 200, carried no error event, had a finish_reason, ended with
`[DONE]` and its usage reported all {args.max_tokens} tokens. "Dip" compares tokens/s while rolling (first SIGTERM
to the last replica back UP) with tokens/s before.

Tokens received per second ([rN] marks the second replica N got SIGTERM):

{timeline}
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--concurrency", type=int, default=12)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--users", type=int, default=24)
    ap.add_argument("--warmup", type=float, default=20.0)
    ap.add_argument("--settle", type=float, default=20.0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(HERE / "results" / "rolling_restart.md"))
    args = ap.parse_args()
    if binary("haproxy") is None:
        print(f"haproxy is not installed ({APT_HINT})", file=sys.stderr)
        return 1
    args.model = args.model or default_model()
    with tempfile.TemporaryDirectory(prefix="inferd-rolling-") as tmp:
        report = asyncio.run(run(args, Path(tmp)))
    text = markdown(report, args, args.model)
    Path(args.out).write_text(text)
    print(text)
    return 0 if not report.load.failed and not report.load.truncated else 1


if __name__ == "__main__":
    sys.exit(main())
