-- Training runs (stage 4, train) and the per-rank, per-step telemetry their ranks wrote.
CREATE TABLE IF NOT EXISTS runs (
    run_id VARCHAR PRIMARY KEY,
    plan_fingerprint VARCHAR NOT NULL,        -- planner.specs.plan.Plan.fingerprint()
    plan_json JSON NOT NULL,
    model VARCHAR NOT NULL,
    predicted_step_time_s DOUBLE,             -- plan.predicted.step_time_s when the plan has a prediction
    status VARCHAR NOT NULL CHECK (status IN ('running', 'completed', 'failed')),
    restarts INTEGER NOT NULL DEFAULT 0,      -- torchrun restarts seen in telemetry (max attempt)
    num_steps INTEGER NOT NULL,               -- steps asked for (total, including resumed ones)
    world_size INTEGER NOT NULL,
    run_dir VARCHAR NOT NULL,
    message VARCHAR,                          -- why it failed, if it did
    started_at TIMESTAMP NOT NULL DEFAULT now(),
    ended_at TIMESTAMP
);

CREATE TABLE IF NOT EXISTS step_metrics (
    run_id VARCHAR NOT NULL,
    rank INTEGER NOT NULL,
    step INTEGER NOT NULL,
    stage INTEGER NOT NULL,
    replica INTEGER NOT NULL,
    tp_index INTEGER NOT NULL,
    attempt INTEGER NOT NULL,                 -- TORCHELASTIC_RESTART_COUNT of the attempt that wrote the row
    num_microbatches INTEGER NOT NULL,
    samples INTEGER NOT NULL,                 -- samples per step of this rank's replica
    tokens BIGINT NOT NULL,                   -- tokens per step of this rank's replica
    step_time_s DOUBLE NOT NULL,
    compute_s DOUBLE NOT NULL,
    comm_wait_s DOUBLE NOT NULL,              -- step_time_s - compute_s - optimizer_s (worker/telemetry.py)
    optimizer_s DOUBLE NOT NULL,
    loss DOUBLE,                              -- replica's mean micro-batch loss; last stage only
    memory_bytes BIGINT NOT NULL,
    memory_kind VARCHAR NOT NULL,             -- cuda_max_allocated | cpu_max_rss
    wall_time_s DOUBLE NOT NULL,              -- unix time the row was written
    PRIMARY KEY (run_id, rank, step)
);

-- One row per (run, step): the slowest rank's step time against the plan's prediction, the
-- global loss (share-weighted over replicas' last stages) and throughput.
CREATE OR REPLACE VIEW run_steps AS
SELECT m.run_id,
       m.step,
       max(m.step_time_s) AS step_time_s,
       max(m.compute_s) AS max_compute_s,
       max(m.comm_wait_s) AS max_comm_wait_s,
       r.predicted_step_time_s,
       max(m.step_time_s) / nullif(r.predicted_step_time_s, 0) AS measured_over_predicted,
       sum(m.loss * m.samples) FILTER (WHERE m.loss IS NOT NULL AND m.tp_index = 0)
           / nullif(sum(m.samples) FILTER (WHERE m.loss IS NOT NULL AND m.tp_index = 0), 0) AS loss,
       sum(m.tokens) FILTER (WHERE m.stage = 0 AND m.tp_index = 0) / max(m.step_time_s) AS tokens_per_s,
       max(m.memory_bytes) AS max_memory_bytes
FROM step_metrics m JOIN runs r USING (run_id)
GROUP BY m.run_id, m.step, r.predicted_step_time_s;
