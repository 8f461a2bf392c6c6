-- Validation loss of a training run (issue #38: `--eval-every N --eval-batches K` on a prepared
-- dataset's held-out split): one row per evaluation, read from <run>/eval.jsonl (storage/runs.py).
CREATE TABLE IF NOT EXISTS eval_metrics (
    run_id VARCHAR NOT NULL,
    step INTEGER NOT NULL,                    -- optimizer steps done when it was evaluated
    val_loss DOUBLE NOT NULL,                 -- mean next-token loss over the evaluated tokens
    num_batches INTEGER NOT NULL,
    tokens BIGINT NOT NULL,
    wall_time_s DOUBLE,
    PRIMARY KEY (run_id, step)
);
