-- What the ranks did to survive a fault, one row per event (storage/runs.py record_run_events):
-- a torchrun restart, a checkpoint skipped as unreadable (fallback), the checkpoint a start resumed
-- from, a fresh start the user asked for over unreadable checkpoints. Read from <run>/resume.jsonl.
CREATE TABLE IF NOT EXISTS run_events (
    run_id VARCHAR NOT NULL,
    seq INTEGER NOT NULL,                     -- order within the run: resume.jsonl line, then event in it
    attempt INTEGER NOT NULL,                 -- TORCHELASTIC_RESTART_COUNT of the start that recorded it
    kind VARCHAR NOT NULL CHECK (kind IN ('restart', 'fallback', 'resume', 'fresh_start')),
    step INTEGER,                             -- the step training went on from
    checkpoint VARCHAR,                       -- the checkpoint resumed from or skipped
    message VARCHAR NOT NULL,                 -- the line the console and the Prefect log showed
    recorded_at TIMESTAMP NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, seq)
);
