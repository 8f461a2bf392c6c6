-- A job's training options typed (issue #37): the whole RunOptions (planner/specs/runspec.py) as JSON,
-- merged over the config's [train] at submission and validated there once; steps = the job's
-- iterations. NULL on rows written before this migration: their `train_json` (the flags given, a
-- partial dict) is read over RunOptions' defaults instead, so old queued jobs keep running.
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS options JSON;
