-- A run killed with its command (issue #36): `owner` names the process that launched it
-- (host:pid:start-ticks, storage/lease.py's form); a later command that finds a 'running' row whose
-- owner is gone on this host closes it as 'killed'. DuckDB cannot alter a CHECK constraint, so the
-- table is rebuilt with 'killed' allowed (same columns, same rows, then `owner`).
CREATE TABLE runs_0021 (
    run_id VARCHAR PRIMARY KEY,
    plan_fingerprint VARCHAR NOT NULL,
    plan_json JSON NOT NULL,
    model VARCHAR NOT NULL,
    predicted_step_time_s DOUBLE,
    status VARCHAR NOT NULL CHECK (status IN ('running', 'completed', 'failed', 'killed')),
    restarts INTEGER NOT NULL DEFAULT 0,
    num_steps INTEGER NOT NULL,
    world_size INTEGER NOT NULL,
    run_dir VARCHAR NOT NULL,
    message VARCHAR,
    started_at TIMESTAMP NOT NULL DEFAULT now(),
    ended_at TIMESTAMP,
    generation INTEGER DEFAULT 0,
    executor VARCHAR,
    slurm_job_id VARCHAR,
    owner VARCHAR
);
INSERT INTO runs_0021 SELECT run_id, plan_fingerprint, plan_json, model, predicted_step_time_s, status, restarts,
    num_steps, world_size, run_dir, message, started_at, ended_at, generation, executor, slurm_job_id, NULL
FROM runs;
DROP VIEW IF EXISTS run_steps;
DROP TABLE runs;
ALTER TABLE runs_0021 RENAME TO runs;
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
