-- One scheduler round at a time (issue #36): a round holds the lease named 'scheduler' for as long
-- as it reads, decides and applies. Another round that finds it held by a live holder, not past
-- its expiry, does nothing; a holder whose process is gone (same host) or whose expiry passed is
-- replaced. `last_round_end` is when the latest round let go of it: a round scheduled before that
-- (a missed round Prefect starts late, after a restart) is collapsed into that round.
CREATE TABLE IF NOT EXISTS leases (
    name VARCHAR PRIMARY KEY,
    holder VARCHAR,                -- host:pid:start-ticks:token of the round holding it; NULL when free
    acquired_at TIMESTAMP,
    expires_at TIMESTAMP,
    last_round_end TIMESTAMP       -- when the latest holder released it
);
