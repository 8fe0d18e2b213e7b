"""The children benchmark group, run end to end at its quick size: its own scheduler, ingest and
saga processes, an SDK worker fanning out 100 children and resuming. The group broke unseen once:
when resumed attempts began reading their journal from the saga service (issue 45) it started no
saga, every parent failed its attempts on UNAVAILABLE, and the group timed out. No other test runs
a benchmark group, so this one holds the group that crosses the most services."""

from __future__ import annotations

from bench import children, env
from bench.config import Config


async def test_the_children_group_measures_a_fan_out_and_a_resume(pg_server_dsn: str, redis_url: str) -> None:
    stores = env.Stores(pg_server_dsn, redis_url, "test", "test")
    cfg = Config(quick=True)
    fan, resume = children.declare(cfg)
    try:
        await children.run(stores, cfg, [fan, resume])
    finally:
        await stores.cleanup()
    for fig in (fan, resume):
        assert fig.status == "measured", fig
        assert fig.value is not None and fig.value > 0, fig
        assert fig.baseline is not None and fig.baseline > 0, fig
        assert len(fig.details["samples_ms"]) == fig.details["rounds"] == 3, fig.details
