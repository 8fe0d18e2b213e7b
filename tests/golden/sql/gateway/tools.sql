-- name: LockDeployment
-- params: project_id, name
-- A deployment's replicas, locked until the scaling transaction ends.
SELECT replicas FROM awooop_refgw_deployment WHERE project_id = $1 AND name = $2 FOR UPDATE

-- name: ScaleDeployment
-- params: replicas, project_id, name
UPDATE awooop_refgw_deployment SET replicas = $1, updated_at = now()
 WHERE project_id = $2 AND name = $3

-- name: CreateResource
-- params: project_id, kind, name, spec
-- A resource; no row when one of that kind and name exists.
INSERT INTO awooop_refgw_resource (project_id, kind, name, spec) VALUES ($1, $2, $3, $4)
ON CONFLICT DO NOTHING RETURNING true

-- name: PutDeployment
-- params: project_id, name, replicas
-- The deployment row of a Deployment resource (replaced when one was left behind).
INSERT INTO awooop_refgw_deployment (project_id, name, replicas) VALUES ($1, $2, $3)
ON CONFLICT (project_id, name) DO UPDATE SET replicas = EXCLUDED.replicas, updated_at = now()

-- name: DeleteResource
-- params: project_id, kind, name
-- true when it existed.
DELETE FROM awooop_refgw_resource WHERE project_id = $1 AND kind = $2 AND name = $3 RETURNING true

-- name: DeleteDeployment
-- params: project_id, name
DELETE FROM awooop_refgw_deployment WHERE project_id = $1 AND name = $2

-- name: InsertRow
-- params: project_id, table_name, data
INSERT INTO awooop_refgw_row (project_id, table_name, data) VALUES ($1, $2, $3) RETURNING row_id

-- name: DeleteRow
-- params: project_id, table_name, row_id
-- true when it existed.
DELETE FROM awooop_refgw_row
 WHERE project_id = $1 AND table_name = $2 AND row_id = $3
RETURNING true

-- name: WriteKnowledge
-- params: project_id, entry_id, content
-- An entry, created or replaced; true when created (xmax = 0: the row is a fresh insert).
INSERT INTO awooop_refgw_knowledge (project_id, entry_id, content) VALUES ($1, $2, $3)
ON CONFLICT (project_id, entry_id) DO UPDATE SET content = EXCLUDED.content
RETURNING (xmax = 0)

-- name: DeleteKnowledge
-- params: project_id, entry_id
-- true when it existed.
DELETE FROM awooop_refgw_knowledge WHERE project_id = $1 AND entry_id = $2 RETURNING true
