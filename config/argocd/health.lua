-- Argo CD health check for vcp.dev/VClusterPlugin (Lua 5.1, as Argo CD runs it). The same
-- table as the operator's Ready / PHASE (README, "Status and condition reasons"):
--   Healthy      Ready=True at the current generation, and RuntimeHealthy is True or not
--                reported (a plugin with an image reports none).
--   Progressing  no status yet; the operator has not observed the current generation; phase
--                Pending (such as a vCluster that does not exist yet) or Installing (the
--                runtime is starting: RuntimeHealthy=False Starting, or Unknown, or reported
--                for an older generation); being removed; Ready missing, Unknown or set for an
--                older generation.
--   Degraded     Ready=False (phase Failed: the install is refused; phase Degraded: the
--                runtime reports TypeUnavailable, PatchFailed, SyncErrors or HostObjectConflict), or
--                RuntimeHealthy=False for such a reason while Ready still says True: the
--                condition's reason and message say why.
local hs = {}

local function describe(condition, fallback)
  if condition == nil then
    return fallback
  end
  local text = condition.message
  if text == nil or text == "" then
    text = fallback
  end
  if condition.reason ~= nil and condition.reason ~= "" then
    return condition.reason .. ": " .. text
  end
  return text
end

if obj.status == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for vcluster-plugin-operator to act on this plugin"
  return hs
end

local ready = nil
local runtime = nil
if obj.status.conditions ~= nil then
  for _, condition in ipairs(obj.status.conditions) do
    if condition.type == "Ready" then
      ready = condition
    elseif condition.type == "RuntimeHealthy" then
      runtime = condition
    end
  end
end

local generation = obj.metadata.generation
local observed = obj.status.observedGeneration
local phase = obj.status.phase

if obj.metadata.deletionTimestamp ~= nil or phase == "Terminating" then
  hs.status = "Progressing"
  hs.message = describe(ready, "Removing the plugin from its vCluster")
  return hs
end

if generation ~= nil and (observed == nil or observed < generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for vcluster-plugin-operator to observe generation " .. tostring(generation)
  if observed ~= nil then
    hs.message = hs.message .. " (observed: " .. tostring(observed) .. ")"
  end
  return hs
end

if phase == "Pending" or phase == "Installing" then
  hs.status = "Progressing"
  hs.message = describe(ready, phase)
  return hs
end

if ready == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the Ready condition"
  return hs
end

if generation ~= nil and ready.observedGeneration ~= nil and ready.observedGeneration < generation then
  hs.status = "Progressing"
  hs.message = "The Ready condition is for generation " .. tostring(ready.observedGeneration) ..
    ", not yet for " .. tostring(generation)
  return hs
end

if ready.status == "True" and runtime ~= nil and generation ~= nil and
    runtime.observedGeneration ~= nil and runtime.observedGeneration < generation then
  hs.status = "Progressing"
  hs.message = "RuntimeUpdating: the runtime reports generation " ..
    tostring(runtime.observedGeneration) .. ", not yet " .. tostring(generation)
  return hs
end

if ready.status == "True" and runtime ~= nil and runtime.status ~= "True" then
  -- The runtime's report is newer than the operator's last reconcile.
  if runtime.status == "False" and runtime.reason ~= "Starting" then
    hs.status = "Degraded"
  else
    hs.status = "Progressing"
  end
  hs.message = describe(runtime, "The runtime is not healthy")
  return hs
end

if ready.status == "True" then
  hs.status = "Healthy"
  hs.message = describe(ready, "Installed")
  return hs
end

if ready.status == "False" then
  hs.status = "Degraded"
  hs.message = describe(ready, "Not ready")
  return hs
end

hs.status = "Progressing"
hs.message = describe(ready, "Ready is Unknown")
return hs
