-- The Slurm job that ran a training run (issue #28: launches through `--executor slurm`): its job id,
-- so a user finds it in squeue/sacct. NULL = launched by meshplan's local executor.
ALTER TABLE runs ADD COLUMN IF NOT EXISTS executor VARCHAR;
ALTER TABLE runs ADD COLUMN IF NOT EXISTS slurm_job_id VARCHAR;
