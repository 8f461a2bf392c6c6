-- Elastic execution of queued jobs (flows/job.py): what a job trains with, where its run folder is,
-- the allocation it was admitted with (the scheduler shrinks a grown job back to it) and the pid of
-- its runner process (a running job whose runner is gone goes back to the queue).
-- train_json holds the job's training options (data, optimizer, lr, seed, checkpoint_every) as JSON.
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS train_json VARCHAR DEFAULT '{}';
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS run_dir VARCHAR;
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS base_allocation VARCHAR;
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS runner_pid INTEGER;
