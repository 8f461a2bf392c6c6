-- Stage 5 (replan): every re-planning decision, and the control fields ranks log per step.
CREATE TABLE IF NOT EXISTS replan_decisions (
    run_id VARCHAR NOT NULL,
    decision_id INTEGER NOT NULL,             -- 0, 1, 2 … per run, in decision order
    step INTEGER NOT NULL,                    -- last step seen in telemetry when deciding
    source VARCHAR NOT NULL,                  -- monitor (live, inside train_flow) | replan_flow
    detections JSON NOT NULL,                 -- [{rank, kind, factor, detected_at_step, since_step}]
    options JSON NOT NULL,                    -- [{action, step_time_s, switch_cost_s, net_gain_s, chosen}]
    keep_step_time_s DOUBLE NOT NULL,         -- predicted step of the running plan under the slowdowns
    measured_step_time_s DOUBLE,              -- median slowest-rank step over the last steps
    chosen_action VARCHAR NOT NULL CHECK (chosen_action IN ('keep', 'rebalance', 'relayout')),
    net_gain_s DOUBLE NOT NULL,
    reason VARCHAR NOT NULL,
    acted BOOLEAN NOT NULL,                   -- a control message was written / a relaunch started
    control_version INTEGER,                  -- the control.json version written, if any
    new_plan_json JSON,                       -- the plan switched to, if any
    decided_at TIMESTAMP NOT NULL DEFAULT now(),
    PRIMARY KEY (run_id, decision_id)
);

ALTER TABLE step_metrics ADD COLUMN IF NOT EXISTS control_version INTEGER;   -- control.json version in force
ALTER TABLE step_metrics ADD COLUMN IF NOT EXISTS switch_action VARCHAR;     -- set on the step a switch took effect
ALTER TABLE step_metrics ADD COLUMN IF NOT EXISTS checkpoint_s DOUBLE;       -- checkpoint save after this step
