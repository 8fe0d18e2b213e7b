-- A schedule whose tick failed (or that has no tick left) says why, and waits an hour before it
-- is tried again, while every other schedule fires (services/scheduler/schedules.py).
ALTER TABLE awooop_schedule
    ADD COLUMN last_error    TEXT,
    ADD COLUMN last_error_at TIMESTAMPTZ;
