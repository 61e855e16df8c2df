-- Argo CD health of a kube-headroom.dev HeadroomConfig or NodePoolProfile (Lua 5.1).
-- Reads the conditions the Headroom controller writes, like kstatus does:
--   status behind the spec generation, or Reconciling=True -> Progressing
--   Stalled=True (the spec cannot be acted on)              -> Degraded
--   Ready=True                                              -> Healthy (Suspended when paused)
-- NodePoolProfile/health.lua is a link to this file: both kinds use the same script.
local hs = {status = "Progressing", message = "Waiting for the Headroom controller to report status"}
if obj.metadata ~= nil and obj.metadata.deletionTimestamp ~= nil then
  hs.message = "Being deleted"
  return hs
end
if obj.status == nil then
  return hs
end
local generation = obj.metadata.generation
local observed = obj.status.observedGeneration
if generation ~= nil and (observed == nil or observed < generation) then
  hs.message = "Waiting for the controller to observe generation " .. generation
  return hs
end
local conditions = {}
if obj.status.conditions ~= nil then
  for _, c in ipairs(obj.status.conditions) do
    conditions[c.type] = c
  end
end
local stalled, reconciling, ready = conditions["Stalled"], conditions["Reconciling"], conditions["Ready"]
if stalled ~= nil and stalled.status == "True" then
  hs.status = "Degraded"
  hs.message = stalled.message
  return hs
end
if reconciling ~= nil and reconciling.status == "True" then
  hs.message = reconciling.message
  return hs
end
if ready ~= nil and ready.status == "True" then
  if obj.status.mode == "Paused" then
    hs.status = "Suspended"
    hs.message = "Paused: the pool's limits are left as they are"
    return hs
  end
  hs.status = "Healthy"
  hs.message = ready.message
  local conflict = conditions["Conflict"]
  if conflict ~= nil and conflict.status == "True" then
    hs.message = hs.message .. "; " .. conflict.message
  end
  if obj.status.mode == "DryRun" then
    hs.message = hs.message .. " (dry-run: no resize is written)"
  end
  return hs
end
if ready ~= nil and ready.message ~= nil then
  hs.message = ready.message -- not ready yet, or retrying a failed reconcile
end
return hs
