// Command argocd-lua runs an Argo CD resource health script the way Argo CD's application
// controller does (argoproj/argo-cd, util/lua/lua.go: VM.runLua and VM.ExecuteHealthLua;
// util/lua/oslib_safe.go), with github.com/yuin/gopher-lua, the engine Argo CD embeds:
//
//   - a state without the standard libraries (lua.Options{SkipOpenLibs: true}), then only
//     package, base and table opened, and a "safe" os holding only time and date (also
//     preloaded, so that require("os") works); the json module of layeh.com/gopher-json
//     preloaded. No string, math, io or debug library: a script that uses them fails here as
//     in Argo CD;
//   - the live object decoded from JSON into Lua values as Argo CD's decodeValue does
//     (objects → tables keyed by string, arrays → sequences, numbers → LNumber, null → nil);
//   - a one-second deadline;
//   - the returned table read as Argo CD reads it (encoded to JSON, then status and message),
//     an unknown status becoming "Unknown" with Argo CD's message.
//
// Usage: argocd-lua HEALTH_LUA < OBJECT_JSON; prints {"status": ..., "message": ...}.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	lua "github.com/yuin/gopher-lua"
	luajson "layeh.com/gopher-json"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: argocd-lua HEALTH_LUA < OBJECT_JSON")
		os.Exit(2)
	}
	script, err := os.ReadFile(os.Args[1])
	check(err)
	input, err := io.ReadAll(os.Stdin)
	check(err)
	var object map[string]interface{}
	check(json.Unmarshal(input, &object))

	l := lua.NewState(lua.Options{SkipOpenLibs: true})
	defer l.Close()
	for _, lib := range []struct {
		name string
		open lua.LGFunction
	}{
		{lua.LoadLibName, lua.OpenPackage},
		{lua.BaseLibName, lua.OpenBase},
		{lua.TabLibName, lua.OpenTable},
		{lua.OsLibName, openSafeOs},
	} {
		check(l.CallByParam(lua.P{Fn: l.NewFunction(lib.open), NRet: 0, Protect: true}, lua.LString(lib.name)))
	}
	l.PreloadModule(lua.OsLibName, safeOsLoader)
	luajson.Preload(l)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	l.SetContext(ctx)
	l.SetGlobal("obj", toLua(l, object))
	check(l.DoString(string(script)))

	result := l.Get(-1)
	if result.Type() != lua.LTTable {
		check(fmt.Errorf("expect table output from Lua script, not %s", result.Type()))
	}
	encoded, err := luajson.Encode(result)
	check(err)
	var health struct {
		Status  string `json:"status"`
		Message string `json:"message"`
	}
	check(json.Unmarshal(encoded, &health))
	switch health.Status {
	case "Unknown", "Progressing", "Suspended", "Healthy", "Degraded", "Missing":
	default:
		health.Status, health.Message = "Unknown", "Lua returned an invalid health status"
	}
	out, err := json.Marshal(health)
	check(err)
	fmt.Println(string(out))
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "argocd-lua:", err)
		os.Exit(1)
	}
}

// toLua converts a decoded JSON value into Lua values, as Argo CD's decodeValue does.
func toLua(l *lua.LState, value interface{}) lua.LValue {
	switch v := value.(type) {
	case bool:
		return lua.LBool(v)
	case float64:
		return lua.LNumber(v)
	case string:
		return lua.LString(v)
	case []interface{}:
		table := l.CreateTable(len(v), 0)
		for _, item := range v {
			table.Append(toLua(l, item))
		}
		return table
	case map[string]interface{}:
		table := l.CreateTable(0, len(v))
		for key, item := range v {
			table.RawSetH(lua.LString(key), toLua(l, item))
		}
		return table
	}
	return lua.LNil
}

// The os functions Argo CD keeps for scripts: time and date, nothing that reads, writes or
// exits.
var osFuncs = map[string]lua.LGFunction{"time": osTime, "date": osDate}

func openSafeOs(l *lua.LState) int {
	l.Push(l.RegisterModule(lua.OsLibName, osFuncs))
	return 1
}

func safeOsLoader(l *lua.LState) int {
	l.Push(l.SetFuncs(l.NewTable(), osFuncs))
	return 1
}

func osTime(l *lua.LState) int {
	if l.GetTop() == 0 {
		l.Push(lua.LNumber(time.Now().Unix()))
		return 1
	}
	t := l.CheckTable(1)
	field := func(key string, def int) int {
		if n, ok := t.RawGetString(key).(lua.LNumber); ok {
			return int(n)
		}
		return def
	}
	at := time.Date(field("year", -1), time.Month(field("month", -1)), field("day", -1),
		field("hour", 12), field("min", 0), field("sec", 0), 0, time.Local)
	l.Push(lua.LNumber(at.Unix()))
	return 1
}

// osDate supports "*t" (a table) and otherwise the RFC 3339 form of the time; a health script
// of this project does not call it.
func osDate(l *lua.LState) int {
	t := time.Now()
	format := "%c"
	if l.GetTop() >= 1 {
		format = l.CheckString(1)
	}
	if len(format) > 0 && format[0] == '!' {
		t, format = t.UTC(), format[1:]
	}
	if l.GetTop() >= 2 {
		t = time.Unix(l.CheckInt64(2), 0)
	}
	if format == "*t" {
		table := l.NewTable()
		for key, value := range map[string]int{
			"year": t.Year(), "month": int(t.Month()), "day": t.Day(), "hour": t.Hour(),
			"min": t.Minute(), "sec": t.Second(), "wday": int(t.Weekday()) + 1,
		} {
			table.RawSetString(key, lua.LNumber(value))
		}
		table.RawSetString("isdst", lua.LFalse)
		l.Push(table)
		return 1
	}
	l.Push(lua.LString(t.Format(time.RFC3339)))
	return 1
}
