// The Argo CD health-check driver of tests/tests/argocd_health.rs: runs config/argocd/health.lua
// in gopher-lua, the engine Argo CD embeds, with only the libraries Argo CD opens for health
// scripts. Built and cached by scripts/oracles (ARGOCD_LUA=...); nothing of it is committed.
module vcp.dev/tests/argocd-lua

go 1.23

require (
	github.com/yuin/gopher-lua v1.1.2
	layeh.com/gopher-json v0.0.0-20201124131017-552bb3c4c3bf
)
