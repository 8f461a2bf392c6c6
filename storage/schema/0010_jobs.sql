-- Jobs and their queue for the multi-job scheduler (planner/schedule): one row a job with its
-- current state, and one row per state transition (queued → running → resizing → running →
-- finished | failed | cancelled), each written in the same transaction as the state it sets, so a
-- process killed mid-round leaves every job in a state its history explains.
CREATE TABLE IF NOT EXISTS jobs (
    job_id VARCHAR PRIMARY KEY,
    model VARCHAR NOT NULL,
    global_batch INTEGER NOT NULL,
    iterations BIGINT NOT NULL,
    seq INTEGER,
    priority INTEGER NOT NULL DEFAULT 0,
    deadline_s DOUBLE,
    gpu_kinds VARCHAR NOT NULL DEFAULT '',
    state VARCHAR NOT NULL,
    allocation VARCHAR,
    submitted_at TIMESTAMP NOT NULL,
    updated_at TIMESTAMP NOT NULL
);
CREATE TABLE IF NOT EXISTS job_events (
    job_id VARCHAR NOT NULL,
    seq INTEGER NOT NULL,
    from_state VARCHAR,
    to_state VARCHAR NOT NULL,
    allocation VARCHAR,
    reason VARCHAR NOT NULL DEFAULT '',
    event_at TIMESTAMP NOT NULL,
    PRIMARY KEY (job_id, seq)
);
