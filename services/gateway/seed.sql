-- name: SeedDemo :val
-- One statement: the demo resource and its deployment row together, as k8s_create_resource makes
-- them; nothing when the resource exists. Returns the name when it created them.
WITH resource AS (
    INSERT INTO awooop_refgw_resource (project_id, kind, name, spec)
    VALUES (:project_id, 'Deployment', :name, jsonb_build_object('replicas', :replicas::int))
    ON CONFLICT DO NOTHING
    RETURNING project_id, name
)
INSERT INTO awooop_refgw_deployment (project_id, name, replicas)
SELECT project_id, name, :replicas FROM resource
ON CONFLICT (project_id, name) DO NOTHING
RETURNING name
