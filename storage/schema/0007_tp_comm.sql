-- Tensor-parallel blocks profiled on a real tp group (worker.profile_layers --tp-group real) time
-- their all-reduces too; the cost model must then not add its own. Older rows: fake group, FALSE.
ALTER TABLE layer_profiles ADD COLUMN IF NOT EXISTS tp_comm_included BOOLEAN DEFAULT FALSE;
