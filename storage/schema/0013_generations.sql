-- Fenced generations (issue #31): every launch of a run folder (a `meshplan train` run, or one
-- launch of a queued job, whose run is named after it) is a generation, numbered from 1 and
-- recorded here and in the run folder's control.json before any rank starts. Ranks of an older
-- generation exit at their next step or checkpoint boundary; the launch first stops them by label.
-- 0 = a run recorded before this migration (or never launched).
ALTER TABLE runs ADD COLUMN IF NOT EXISTS generation INTEGER DEFAULT 0;
