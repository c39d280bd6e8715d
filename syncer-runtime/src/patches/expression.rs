//! The JavaScript of `patches[].expression` / `reverseExpression`, evaluated in a sandbox with a
//! time and a memory bound (pure: no I/O, no shared state between evaluations).
//!
//! # What an expression sees (vCluster's documentation of `sync.*.patches`, "expression")
//!
//! The source is a script; its completion value is the result (`'"patched-" + value'`, and also
//! `let a = value.split("/"); a[a.length - 1]`). Globals:
//!
//! - `value`: the value at the patch's path (any JSON value), one evaluation per location of a
//!   `[*]` path;
//! - `valueExists`: whether the value is there. vCluster v0.30 skips a path that is not found
//!   (`config.TranslatePatch.path`: "If the path is not found within the patch, the patch is not
//!   applied"; its v0.29.1 release notes withdrew setting new fields), so an expression only runs
//!   where the value exists and this is always `true`; it is provided for expressions written
//!   for later vCluster versions;
//! - `context.vcluster.name`, `context.vcluster.namespace`: the vCluster and its host namespace;
//! - `context.virtualObject`, `context.hostObject`: the object on each side as JSON (on the way
//!   down the host object is the copy as translated so far; `null` when there is none yet);
//! - `context.path`: the concrete location evaluated, in the path notation (`spec.rules[0].name`);
//! - `btoa(s)`, `atob(s)`: base64 of a binary string (each character one byte, code points up
//!   to 255; `btoa` of a wider character and `atob` of invalid base64 throw), as in browsers.
//!
//! The result replaces the value at the location. `undefined` (and anything JSON cannot carry:
//! a function, a symbol) and `null` remove the field: a JSON merge patch, which the runtime
//! writes with, reads `null` as "remove", and the API server stores no `null` for an absent
//! field, so a `null` kept in the desired object would differ from the stored one on every
//! reconcile and be written again and again. An array element is set to `null` instead (removing
//! it would shift the indexes of the other locations).
//!
//! # The engine: QuickJS through `rquickjs`, and why
//!
//! - **Sandboxed by construction**: QuickJS is an interpreter whose only way out is what the
//!   embedder adds; `rquickjs` adds nothing unless asked (its `std`/`os` modules of
//!   `quickjs-libc` are not part of the crate; no module loader is installed here), so an
//!   expression has the ECMAScript built-ins and `btoa` / `atob`, and no file, network, process,
//!   clock-setting or module access.
//! - **A time bound**: QuickJS calls an interrupt handler every 100 bytecode branches or
//!   function calls (and sooner after large native work) (`Runtime::set_interrupt_handler`); ours stops the script once the deadline
//!   [`Bounds::time`] (default 100 ms of wall time) has passed, with an exception the script
//!   cannot catch. `while (true) {}` ends there.
//! - **A memory bound**: `Runtime::set_memory_limit` caps what QuickJS allocates (default
//!   [`Bounds::memory`] 16 MiB per evaluation, with a fresh context each time, so the limit is
//!   the evaluation's); an allocation past it fails with an out-of-memory exception; and a
//!   stack limit (`set_max_stack_size`, 512 KiB) turns deep recursion into a `RangeError`.
//! - **Bounded native calls**: the interrupt handler is not called inside one native call, so
//!   the natives whose work grows faster than their input are bounded by size: string
//!   searches, `normalize` / `localeCompare` and the `Array` methods that walk `length` by
//!   guards written in JavaScript (`HELPERS`); BigInts, whose conversions and arithmetic no
//!   script-level wrapper can reach (`String(big)`, template literals, `*`, `**`), by the
//!   engine: QuickJS is built with BigInts of at most 65,536 bits (`RangeError: BigInt is too
//!   large: above 65536 bits, the expression bound`; `syncer-runtime/vendor/rquickjs-sys/
//!   README.vcp.md`), where the slowest call takes milliseconds. Loops over slow native
//!   calls (`forEach(String)` on BigInts, `replaceAll` on megabyte strings) are bounded by
//!   time again: the engine charges its interrupt counter for native work (BigInt operations
//!   by their size, allocations by their bytes) and polls every 100 steps, so the handler
//!   runs within a call or two of the deadline.
//! - **Small and embedded**: QuickJS compiles from C with the machine's compiler (no
//!   prebuilt binary, no JIT, no second toolchain), a few hundred KiB in the binary, and starts
//!   a context in tens of microseconds: one evaluation costs about 0.15 ms (printed by the
//!   unit test `cost_of_one_evaluation`), which keeps the cost per object low. A JavaScript engine is
//!   what vCluster's expressions need (vCluster itself runs them in a JavaScript interpreter);
//!   `boa` (pure Rust) was the alternative, with no memory limit of its own.
//!
//! Every evaluation gets a new context of a runtime kept per thread (a runtime is not `Send`), so
//! nothing an expression defines survives into the next one; the runtime's memory is collected
//! after each evaluation.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::{Duration, Instant};

use rquickjs::context::intrinsic;
use rquickjs::{Context, Ctx, Runtime};
use serde_json::Value;

/// The bounds of one evaluation.
///
/// The defaults were 50 ms and 32 MiB until `5ed73c4`, a commit of tests, set them to 100 ms and
/// 16 MiB without a stated reason (found in a review): its memory test needed the
/// memory bound to stop an allocating script before the time bound did on a loaded machine. The
/// tests that need one bound alone now set a far time bound themselves (`eval_within`), so the
/// defaults answer to the product only: 100 ms is about 600 times one evaluation (0.15 ms,
/// `cost_of_one_evaluation`), room for a loaded node; 16 MiB is what one evaluation may hold
/// beside the others of the runtime's worker threads, and since the objects of the context are
/// parsed only when read (`objects_are_parsed_when_read`) it bounds what the expression uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// Wall time an evaluation may take (default 100 ms).
    pub time: Duration,
    /// Bytes QuickJS may hold during an evaluation (default 16 MiB).
    pub memory: usize,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds {
            time: Duration::from_millis(100),
            memory: 16 << 20,
        }
    }
}

/// The ECMAScript built-ins an expression gets: the base objects (`Object`, `Array`, `String`,
/// `Math`, …), `eval`, `RegExp`, `JSON`, `Date`, `Map` / `Set`, `Promise` (no job queue runs,
/// but the engine's dynamic `import()` needs it to fail cleanly); not `Proxy`, typed arrays,
/// `WeakRef` or `performance` (a clock), which no field transformation needs and each of which
/// costs time to set up per evaluation.
type Intrinsics = (
    intrinsic::Date,
    intrinsic::Eval,
    intrinsic::RegExpCompiler,
    intrinsic::RegExp,
    intrinsic::Json,
    intrinsic::MapSet,
    intrinsic::Promise,
);

/// Defines `context.virtualObject` and `context.hostObject` as properties parsed from their
/// JSON on first read (then plain data properties, as writable as before), so that an
/// expression pays for an object, in time and in memory, only when it reads it. Before: with
/// both objects parsed into every evaluation, an object near the largest etcd stores (1.5 MB
/// of JSON) did not fit the memory bound even for `value + "-x"` (a 1.5 MB array of numbers
/// needs 48 MiB in QuickJS, 750,000 small keys 24 MiB: `tests::objects_are_parsed_when_read`).
/// `JSON.parse` is captured here, before the script can replace it.
const LAZY_OBJECTS: &str = r#"
(function (parse) {
  return function (context, virtualObject, hostObject) {
    var lazy = function (name, json) {
      var plain = function (v) {
        Object.defineProperty(context, name,
          { value: v, writable: true, enumerable: true, configurable: true });
      };
      Object.defineProperty(context, name, {
        enumerable: true, configurable: true,
        get: function () { var v = parse(json); plain(v); return v; },
        set: plain,
      });
    };
    lazy('virtualObject', virtualObject);
    lazy('hostObject', hostObject);
  };
})(JSON.parse)
"#;

/// The string searches guarded by the product of their lengths (see the script), and `btoa`
/// and `atob` as in browsers (a binary string is one character per byte, code points up
/// to 255; `btoa` of a wider character and `atob` of malformed base64 throw; `atob` ignores
/// ASCII white space and accepts missing padding), written in JavaScript: a function
/// implemented in Rust would hold its context alive (a reference the engine's collector cannot
/// see through), so a script that ran out of memory would keep its memory after its context is
/// dropped.
const HELPERS: &str = r#"
(function (g) {
  var A = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/';
  // the original, before the array guards below replace it (the guards call it on `arguments`)
  var argsOf = Function.prototype.call.bind(Array.prototype.slice);
  g.btoa = function btoa(data) {
    var s = String(data), out = '';
    for (var i = 0; i < s.length; i += 3) {
      var a = s.charCodeAt(i), b = s.charCodeAt(i + 1), c = s.charCodeAt(i + 2);
      if (a > 255 || b > 255 || c > 255) {
        throw new Error('btoa: the string contains characters outside of the Latin1 range');
      }
      var n = (a << 16) | ((b || 0) << 8) | (c || 0);
      out += A[(n >> 18) & 63] + A[(n >> 12) & 63] +
        (i + 1 < s.length ? A[(n >> 6) & 63] : '=') + (i + 2 < s.length ? A[n & 63] : '=');
    }
    return out;
  };
  // QuickJS's string searches are native loops that never reach the interrupt handler, and a
  // naive search costs the product of the two lengths: `h.indexOf(n)` with 3,000,000 and
  // 1,500,000 characters ran for 18 minutes past a 100 ms bound. Each such method checks the
  // product first (MAX_SEARCH) and throws a RangeError above it; the originals stay in this
  // closure, and the replacements can be neither written nor redefined.
  var MAX_SEARCH = 10000000;
  var S = String.prototype;
  var searches = ['indexOf', 'lastIndexOf', 'includes', 'startsWith', 'endsWith', 'split',
    'replace', 'replaceAll'];
  var protocol = { split: Symbol.split, replace: Symbol.replace, replaceAll: Symbol.replace };
  searches.forEach(function (name) {
    var original = S[name];
    var guarded = function (pattern) {
      var s = String(this);
      var args = argsOf(arguments);
      var p = pattern;
      var object = p !== null && (typeof p === 'object' || typeof p === 'function');
      // a RegExp (or any object with the method's protocol) runs its own, interruptible code,
      // and `includes` / `startsWith` / `endsWith` refuse a RegExp themselves; anything else is
      // searched for as its string
      var own = object && (protocol[name] ? p[protocol[name]] !== undefined
        : (name !== 'indexOf' && name !== 'lastIndexOf' && p[Symbol.match] !== undefined));
      if (!own) {
        p = p === undefined && name === 'split' ? undefined : String(p);
        args[0] = p;
      }
      if (typeof p === 'string' && s.length * Math.max(p.length, 1) > MAX_SEARCH) {
        throw new RangeError('String.prototype.' + name + ': searching ' + p.length +
          ' characters in ' + s.length + ' is above the expression bound (' + MAX_SEARCH +
          ' as their product)');
      }
      return original.apply(s, args);
    };
    Object.defineProperty(S, name, { value: guarded, writable: false, configurable: false,
      enumerable: false });
  });
  // Unicode normalization sorts each run of combining marks by insertion (QuickJS's
  // libunicode), one native call whose worst case is the square of the length:
  // `normalize()` of 400,000 alternating marks ran 58 s, and `localeCompare` normalizes both
  // of its strings (an attacker's expressions did). Both check the squares of the
  // lengths against MAX_SEARCH (3,162 characters of marks cost about 4 ms), with the
  // argument converted once, as for the searches.
  [['normalize', false], ['localeCompare', true]].forEach(function (entry) {
    var name = entry[0], other = entry[1], original = S[name];
    var guarded = function () {
      var s = String(this);
      var args = argsOf(arguments);
      var cost = s.length * s.length;
      if (other) {
        args[0] = String(args[0]);
        cost += args[0].length * args[0].length;
      }
      if (cost > MAX_SEARCH) {
        throw new RangeError('String.prototype.' + name + ': normalizing ' + s.length +
          (other ? ' and ' + args[0].length : '') + ' characters is above the expression ' +
          'bound (' + MAX_SEARCH + ' as the sum of their squares)');
      }
      return original.apply(s, args);
    };
    Object.defineProperty(S, name, { value: guarded, writable: false, configurable: false,
      enumerable: false });
  });
  // Array methods loop natively over `length`, which an array-like sets at will:
  // `Array.prototype.join.call({length: 2 ** 53 - 1})` never ends, and `reverse`, `copyWithin`,
  // `sort`, `splice`, `shift`, `unshift` and `flat` on `{length: 1e8}` took seconds (an
  // attacker's expressions did). Each method that walks `length` works on arrays only, of at most
  // MAX_LENGTH elements (a real array that long cannot fit the memory bound; a sparse one is
  // the same trick).
  var MAX_LENGTH = 10000000;
  var AP = Array.prototype;
  ['concat', 'copyWithin', 'every', 'fill', 'filter', 'find', 'findIndex', 'findLast',
    'findLastIndex', 'flat', 'flatMap', 'forEach', 'includes', 'indexOf', 'join', 'lastIndexOf',
    'map', 'pop', 'push', 'reduce', 'reduceRight', 'reverse', 'shift', 'slice', 'some', 'sort',
    'splice', 'toLocaleString', 'toReversed', 'toSorted', 'toSpliced', 'toString', 'unshift',
    'with'].forEach(function (name) {
    var original = AP[name];
    if (typeof original !== 'function') {
      return;
    }
    var guarded = function () {
      if (!Array.isArray(this)) {
        throw new TypeError('Array.prototype.' + name + ' is called on arrays only in an ' +
          'expression (an array-like sets its own length)');
      }
      if (this.length > MAX_LENGTH) {
        throw new RangeError('Array.prototype.' + name + ': an array of ' + this.length +
          ' elements is above the expression bound (' + MAX_LENGTH + ')');
      }
      return original.apply(this, argsOf(arguments));
    };
    Object.defineProperty(AP, name, { value: guarded, writable: false, configurable: false,
      enumerable: false });
  });
  g.atob = function atob(data) {
    var s = String(data).replace(/[\t\n\f\r ]/g, '');
    if (s.length % 4 === 0) s = s.replace(/==?$/, '');
    if (s.length % 4 === 1 || /[^A-Za-z0-9+\/]/.test(s)) {
      throw new Error('atob: the string is not correctly encoded base64');
    }
    var out = '', bits = 0, n = 0;
    for (var i = 0; i < s.length; i++) {
      n = (n << 6) | A.indexOf(s[i]);
      bits += 6;
      if (bits >= 8) {
        bits -= 8;
        out += String.fromCharCode((n >> bits) & 255);
      }
    }
    return out;
  };
})(globalThis);
"#;

/// Stack QuickJS may use (512 KiB): deep recursion throws a `RangeError`.
const MAX_STACK: usize = 512 << 10;

/// What an expression reads (see the module docs).
#[derive(Clone, Copy, Debug)]
pub struct Input<'a> {
    /// `value`.
    pub value: &'a Value,
    /// `context.path`.
    pub path: &'a str,
    /// `context.vcluster.name`.
    pub vcluster_name: &'a str,
    /// `context.vcluster.namespace` (the vCluster's host namespace).
    pub vcluster_namespace: &'a str,
    /// `context.virtualObject` (`null` when absent).
    pub virtual_object: Option<&'a Value>,
    /// `context.hostObject` (`null` when absent).
    pub host_object: Option<&'a Value>,
}

/// Why an evaluation gave no value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ExpressionError {
    /// The time bound passed.
    #[error("the expression ran longer than its time bound of {0:?} and was stopped")]
    Timeout(Duration),
    /// The memory bound was reached.
    #[error("the expression needed more than its memory bound of {0} bytes and was stopped")]
    OutOfMemory(usize),
    /// The script threw (or did not compile).
    #[error("the expression failed: {0}")]
    Thrown(String),
    /// The engine could not be started.
    #[error("the JavaScript engine could not start: {0}")]
    Engine(String),
    /// The result's JSON text is longer than [`MAX_RESULT_BYTES`] (its length, in bytes).
    #[error(
        "the expression's result is {0} bytes of JSON, above the bound of 3 MiB (no object that large can be written)"
    )]
    ResultTooLarge(usize),
}

/// The most JSON one object's expression results may hold, one result or all of one patch's
/// together: 3 MiB, twice etcd's default request limit (1.5 MiB), above which no object can
/// be written anyway. Checked on the JSON text before it is parsed, since a parsed
/// `serde_json::Value` takes up to 20 times its text (an array of small numbers: 2 bytes of
/// text, 32 or more parsed); the fifth fresh attacker's 9 MB of results took the runtime to
/// 292 MB when only QuickJS's 16 MiB bounded them.
pub const MAX_RESULT_BYTES: usize = 3 << 20;

struct Engine {
    runtime: Runtime,
    deadline: Rc<Cell<Option<Instant>>>,
    limit: Cell<usize>,
}

thread_local! {
    static ENGINE: RefCell<Option<Engine>> = const { RefCell::new(None) };
}

fn engine() -> Result<Engine, ExpressionError> {
    let runtime = Runtime::new().map_err(|e| ExpressionError::Engine(e.to_string()))?;
    let deadline: Rc<Cell<Option<Instant>>> = Rc::new(Cell::new(None));
    let watch = deadline.clone();
    runtime.set_interrupt_handler(Some(Box::new(move || {
        watch.get().is_some_and(|at| Instant::now() >= at)
    })));
    runtime.set_max_stack_size(MAX_STACK);
    Ok(Engine {
        runtime,
        deadline,
        limit: Cell::new(0),
    })
}

/// What one evaluation gave: the value, and the length of its JSON text as measured before it
/// was parsed (so that a caller bounding several results together need not serialize them again).
#[derive(Clone, Debug, PartialEq)]
pub struct Evaluated {
    /// `Some(value)` replaces the value; `None` removes it (the result was `undefined` or
    /// `null`; see the module docs).
    pub value: Option<Value>,
    /// The result's compact JSON text in bytes, at most [`MAX_RESULT_BYTES`]; 0 for `None`.
    pub json_bytes: usize,
}

/// Evaluates `source` on `input` within `bounds` ([`Evaluated`]).
///
/// # Errors
/// [`ExpressionError`]: the time or memory bound was reached, the script threw, or its result
/// is above [`MAX_RESULT_BYTES`].
pub fn evaluate(
    source: &str,
    input: &Input<'_>,
    bounds: &Bounds,
) -> Result<Evaluated, ExpressionError> {
    ENGINE.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(engine()?);
        }
        let engine = slot.as_ref().expect("engine set above");
        if engine.limit.get() != bounds.memory {
            engine.runtime.set_memory_limit(bounds.memory);
            engine.limit.set(bounds.memory);
        }
        let result = run(engine, source, input, bounds);
        engine.deadline.set(None);
        if engine.runtime.is_job_pending() {
            // A `Promise` reaction or `queueMicrotask` job the script left: never run, it
            // would keep the evaluation's context and memory alive in this thread's runtime,
            // against the next evaluations' memory bound (the fifth fresh attacker). The
            // runtime is dropped with its jobs; the next evaluation starts a new one.
            *slot = None;
        } else {
            engine.runtime.run_gc();
        }
        result
    })
}

fn run(
    engine: &Engine,
    source: &str,
    input: &Input<'_>,
    bounds: &Bounds,
) -> Result<Evaluated, ExpressionError> {
    let context = serde_json::json!({
        "vcluster": {"name": input.vcluster_name, "namespace": input.vcluster_namespace},
        "path": input.path,
    });
    // serialized before the clock starts: the bound is the script's own time
    let context = context.to_string();
    let value = input.value.to_string();
    // The two objects are parsed only when the script reads them (`LAZY_OBJECTS`)
    let object_json = |o: Option<&Value>| o.map_or_else(|| "null".to_string(), Value::to_string);
    let virtual_object = object_json(input.virtual_object);
    let host_object = object_json(input.host_object);
    let ctx = Context::custom::<Intrinsics>(&engine.runtime)
        .map_err(|e| ExpressionError::Engine(e.to_string()))?;
    let started = Instant::now();
    engine.deadline.set(Some(started + bounds.time));
    let out_of_time = || Instant::now() >= started + bounds.time;
    ctx.with(|ctx| -> Result<Evaluated, ExpressionError> {
        let fail = |ctx: &Ctx<'_>, error: rquickjs::Error| {
            // always take the pending exception out of the engine (it would keep the context,
            // and everything the script allocated, alive)
            let pending = ctx.catch();
            let thrown = if matches!(error, rquickjs::Error::Exception) {
                describe(&pending)
            } else {
                error.to_string()
            };
            drop(pending);
            // QuickJS throws an InternalError "out of memory" when an allocation passes the
            // limit, or `null` when even that error cannot be allocated any more
            let null_thrown = matches!(error, rquickjs::Error::Exception) && thrown == "null";
            if out_of_time() {
                ExpressionError::Timeout(bounds.time)
            } else if thrown.contains("out of memory")
                || null_thrown
                || matches!(error, rquickjs::Error::Allocation)
            {
                ExpressionError::OutOfMemory(bounds.memory)
            } else {
                ExpressionError::Thrown(thrown)
            }
        };
        let globals = ctx.globals();
        let setup = || -> rquickjs::Result<()> {
            globals.set("value", ctx.json_parse(value.as_str())?)?;
            globals.set("valueExists", true)?;
            let context = ctx.json_parse(context.as_str())?;
            globals.set("context", context.clone())?;
            let lazy: rquickjs::Function = ctx.eval(LAZY_OBJECTS)?;
            lazy.call::<_, ()>((context, virtual_object.as_str(), host_object.as_str()))?;
            ctx.eval::<(), _>(HELPERS)?;
            Ok(())
        };
        setup().map_err(|e| fail(&ctx, e))?;
        let result: rquickjs::Value = ctx.eval(source).map_err(|e| fail(&ctx, e))?;
        // a script that ended inside a native call past its deadline (the interrupt handler
        // was not reached again) gives no value either: the bound is the bound
        if out_of_time() {
            return Err(ExpressionError::Timeout(bounds.time));
        }
        let json = ctx.json_stringify(result).map_err(|e| fail(&ctx, e))?;
        let none = Evaluated {
            value: None,
            json_bytes: 0,
        };
        let Some(json) = json else {
            return Ok(none);
        };
        let json = json.to_string().map_err(|e| fail(&ctx, e))?;
        if json.len() > MAX_RESULT_BYTES {
            return Err(ExpressionError::ResultTooLarge(json.len()));
        }
        let value: Value = serde_json::from_str(&json)
            .map_err(|e| ExpressionError::Thrown(format!("the result is not JSON: {e}")))?;
        if value.is_null() {
            return Ok(none);
        }
        Ok(Evaluated {
            value: Some(value),
            json_bytes: json.len(),
        })
    })
}

/// A thrown value as text: an Error's `name: message`, anything else as JSON-ish text.
fn describe(thrown: &rquickjs::Value<'_>) -> String {
    if let Some(exception) = thrown.as_exception() {
        let message = exception.message().unwrap_or_default();
        let name: String = exception
            .get::<_, String>("name")
            .unwrap_or_else(|_| "Error".into());
        return format!("{name}: {message}");
    }
    if let Some(s) = thrown.as_string() {
        return s.to_string().unwrap_or_default();
    }
    if thrown.is_null() {
        return "null".into();
    }
    match thrown.ctx().json_stringify(thrown.clone()) {
        Ok(Some(json)) => json.to_string().unwrap_or_default(),
        _ => format!("{:?}", thrown.type_of()),
    }
}

#[cfg(test)]
mod tests;
