-- A job's model by its dimensions (issue #16: "a model (preset or dims)"): the ModelSpec JSON of a
-- custom or model-file job, which the scheduler prices and the job's ranks build. NULL = the preset
-- named in `model` (every row written before this migration), so old rows keep working.
ALTER TABLE jobs ADD COLUMN IF NOT EXISTS model_json VARCHAR;
