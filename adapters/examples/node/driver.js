#!/usr/bin/env node
// A complete devshim driver in plain Node.js, with no dependencies.
//
// It speaks the driver protocol of docs/driver-protocol.md (schema:
// proto/driver/v1/driver.proto): JSON-RPC 2.0, one JSON object per line,
// requests on stdin, answers and notifications on stdout, logs on stderr.
// Nothing here is specific to Python or to devshim's SDK: that is the point.
//
// Environment:
//   NODE_DRIVER_DEVICES             comma-separated device IDs
//                                   (default "node-0,node-1,node-2")
//   NODE_DRIVER_UNHEALTHY_AFTER_MS  optional: this many ms after initialize is
//                                   answered, mark the last device UNHEALTHY
//                                   and send a health_changed notification
//   NODE_DRIVER_PREFERRED_DELAY_MS  optional: delay every preferred_allocation
//                                   answer by this many ms (to show that a slow
//                                   request does not hold up the others)
"use strict";

const PROTOCOL_VERSION = "1.4.0";
const PROTOCOL_MAJOR = 1;
const DRIVER = { name: "node-example", version: "0.1.0" };
const RESOURCE = "example.com/node";
const CAPABILITIES = { preferred_allocation: true, prestart: false, deallocate: false, post_stop: false };
const DEFAULT_DEVICES = "node-0,node-1,node-2";
// The agreed maximum size of one message, newline excluded.
const MAX_LINE_BYTES = 32 * 1024 * 1024;
const MAX_DEVICE_ID = 63;

// JSON-RPC error codes (docs/driver-protocol.md, "Errors").
const PARSE_ERROR = -32700;
const INVALID_REQUEST = -32600;
const METHOD_NOT_FOUND = -32601;
const INVALID_PARAMS = -32602;
const INTERNAL_ERROR = -32603;
const UNKNOWN_DEVICE = -32001;
const DEVICE_UNHEALTHY = -32002;
const UNKNOWN_RESOURCE = -32003;

// --- logging (stderr only: stdout carries nothing but protocol messages) -----

const MAX_LOG_CHARS = 2000;

function log(level, message) {
  // One log line per call; input echoed into a message may be huge or hold newlines.
  let text = String(message).replace(/\r?\n/g, " | ");
  if (text.length > MAX_LOG_CHARS) text = `${text.slice(0, MAX_LOG_CHARS)}... (${text.length} characters)`;
  process.stderr.write(`${DRIVER.name}: ${level} ${text}\n`);
}

// --- configuration ---------------------------------------------------------

function fail(message) {
  log("ERROR", message);
  process.exit(2);
}

function parseDevices(raw) {
  const ids = raw.split(",").map((s) => s.trim()).filter((s) => s !== "");
  const seen = new Set();
  for (const id of ids) {
    if (id.length > MAX_DEVICE_ID) fail(`NODE_DRIVER_DEVICES: device ID '${id}' is longer than ${MAX_DEVICE_ID} characters`);
    if (seen.has(id)) fail(`NODE_DRIVER_DEVICES: device ID '${id}' is listed twice`);
    seen.add(id);
  }
  return ids;
}

function parseMillis(name) {
  const raw = process.env[name];
  if (raw === undefined || raw.trim() === "") return null;
  if (!/^\d+$/.test(raw.trim())) fail(`${name}: expected a whole number of milliseconds, got '${raw}'`);
  return Number(raw.trim());
}

const deviceIds = parseDevices(process.env.NODE_DRIVER_DEVICES ?? DEFAULT_DEVICES);
const unhealthyAfterMs = parseMillis("NODE_DRIVER_UNHEALTHY_AFTER_MS");
const preferredDelayMs = parseMillis("NODE_DRIVER_PREFERRED_DELAY_MS") ?? 0;

// id -> {id, health, numa_nodes}, in listing order.
const devices = new Map(
  deviceIds.map((id, index) => [id, { id, health: "HEALTHY", numa_nodes: [index % 2] }]),
);

// --- output ----------------------------------------------------------------

let stdoutBroken = false;
process.stdout.on("error", (err) => {
  // devshim went away (EPIPE): nobody is left to answer.
  stdoutBroken = true;
  log("ERROR", `stdout: ${err.message}; exiting`);
  process.exit(1);
});

// Write one message as one line; `done` runs once it has been handed to the OS.
function send(message, done) {
  if (stdoutBroken) return;
  // JSON.stringify escapes every control character inside strings, so the
  // only newline in `line` is the terminator.
  let line = JSON.stringify(message);
  if (Buffer.byteLength(line, "utf8") > MAX_LINE_BYTES) {
    log("ERROR", `a ${Buffer.byteLength(line, "utf8")}-byte message exceeds the ${MAX_LINE_BYTES}-byte limit`);
    if (!("id" in message)) return; // a notification: drop it
    line = JSON.stringify({
      jsonrpc: "2.0",
      id: message.id,
      error: { code: INTERNAL_ERROR, message: `the answer exceeds the ${MAX_LINE_BYTES}-byte line limit` },
    });
  }
  process.stdout.write(line + "\n", done);
}

function notify(method, params) {
  send({ jsonrpc: "2.0", method, params });
}

// Flush stdout, then exit.
function exitAfterFlush(code) {
  if (stdoutBroken) process.exit(code);
  process.stdout.write("", () => process.exit(code));
}

// --- errors ----------------------------------------------------------------

class RpcError extends Error {
  constructor(code, message) {
    super(message);
    this.code = code;
  }
}

// --- params: the proto3 JSON mapping (snake_case or lowerCamelCase; defaults may be omitted) ---

function field(obj, snake) {
  const camel = snake.replace(/_([a-z])/g, (_, c) => c.toUpperCase());
  if (obj[snake] !== undefined && obj[snake] !== null) return obj[snake];
  if (obj[camel] !== undefined && obj[camel] !== null) return obj[camel];
  return undefined;
}

function objectParams(params) {
  if (params === undefined || params === null) return {};
  if (typeof params !== "object" || Array.isArray(params)) throw new RpcError(INVALID_PARAMS, "params must be an object");
  return params;
}

function str(obj, name) {
  const value = field(obj, name);
  if (value === undefined) return "";
  if (typeof value !== "string") throw new RpcError(INVALID_PARAMS, `${name} must be a string`);
  return value;
}

function list(obj, name) {
  const value = field(obj, name);
  if (value === undefined) return [];
  if (!Array.isArray(value)) throw new RpcError(INVALID_PARAMS, `${name} must be a list`);
  return value;
}

function strList(obj, name) {
  const value = list(obj, name);
  for (const item of value) {
    if (typeof item !== "string") throw new RpcError(INVALID_PARAMS, `${name} must be a list of strings`);
  }
  return value;
}

function int32(obj, name) {
  let value = field(obj, name);
  if (value === undefined) return 0;
  // proto3 JSON accepts an int32 as a number or a decimal string.
  if (typeof value === "string" && /^-?\d+$/.test(value)) value = Number(value);
  if (!Number.isInteger(value)) throw new RpcError(INVALID_PARAMS, `${name} must be an integer`);
  return value;
}

function containerList(obj, name) {
  return list(obj, name).map((c) => objectParams(c));
}

function checkResource(resource) {
  if (resource !== RESOURCE) throw new RpcError(UNKNOWN_RESOURCE, `unknown resource '${resource}'`);
}

function checkKnown(resource, ids) {
  for (const id of ids) {
    if (!devices.has(id)) throw new RpcError(UNKNOWN_DEVICE, `${resource}: unknown device '${id}'`);
  }
}

function unique(ids) {
  return [...new Set(ids)];
}

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

// --- the methods -----------------------------------------------------------

let shuttingDown = false;
let unhealthyTimer = null;

const methods = {
  async initialize(params) {
    const p = objectParams(params);
    const version = str(p, "protocol_version");
    const match = /^(\d+)\.\d+\.\d+(?:[-+].*)?$/.exec(version);
    if (!match || Number(match[1]) !== PROTOCOL_MAJOR) {
      throw new RpcError(
        INVALID_REQUEST,
        `unsupported protocol version '${version}': ${DRIVER.name} speaks ${PROTOCOL_VERSION} (the majors must be equal)`,
      );
    }
    const devshimVersion = str(p, "devshim_version");
    // What devshim knows to be in use. This example keeps no allocation
    // state, so it only reports it; a real driver would rebuild from it.
    for (const a of containerList(p, "allocations")) {
      const resource = str(a, "resource");
      const ids = strList(a, "device_ids");
      if (resource !== RESOURCE) log("WARNING", `initialize: allocation of unknown resource '${resource}' ignored`);
      else log("INFO", `initialize: in use: ${ids.join(",") || "(none)"}`);
    }
    log("INFO", `initialized by devshim ${devshimVersion || "(unknown)"} (protocol ${version}); serving ${devices.size} devices`);
    return {
      protocol_version: PROTOCOL_VERSION,
      driver: { ...DRIVER },
      resources: [{ name: RESOURCE, ...CAPABILITIES }],
    };
  },

  async list_devices(params) {
    const p = objectParams(params);
    checkResource(str(p, "resource"));
    return { devices: [...devices.values()].map((d) => ({ id: d.id, health: d.health, numa_nodes: [...d.numa_nodes] })) };
  },

  async allocate(params) {
    const p = objectParams(params);
    const resource = str(p, "resource");
    checkResource(resource);
    const requests = containerList(p, "containers").map((c) => unique(strList(c, "device_ids")));
    for (const ids of requests) {
      checkKnown(resource, ids);
      for (const id of ids) {
        if (devices.get(id).health !== "HEALTHY") {
          throw new RpcError(DEVICE_UNHEALTHY, `${resource}: device '${id}' is unhealthy`);
        }
      }
    }
    return {
      containers: requests.map((ids) => ({
        envs: { EXAMPLE_NODE_DEVICES: ids.join(",") },
        device_nodes: ids.map((id) => ({ container_path: `/dev/node/${id}`, host_path: "/dev/null", permissions: "rw" })),
      })),
    };
  },

  async preferred_allocation(params) {
    const p = objectParams(params);
    const resource = str(p, "resource");
    checkResource(resource);
    const requests = containerList(p, "containers").map((c) => ({
      available: strList(c, "available"),
      mustInclude: strList(c, "must_include"),
      size: int32(c, "size"),
    }));
    for (const r of requests) {
      checkKnown(resource, r.mustInclude);
      checkKnown(resource, r.available);
      if (r.size < 0) throw new RpcError(INVALID_PARAMS, "size must not be negative");
    }
    if (preferredDelayMs > 0) await sleep(preferredDelayMs);
    return {
      containers: requests.map((r) => ({
        // must_include first, then the rest of available in its order.
        device_ids: unique([...r.mustInclude, ...r.available]).slice(0, r.size),
      })),
    };
  },

  // Optional methods this resource does not declare: -32601, which devshim
  // reads as "capability absent".
  async prestart(params) {
    return notImplemented("prestart", params);
  },
  async deallocate(params) {
    return notImplemented("deallocate", params);
  },
  async post_stop(params) {
    return notImplemented("post_stop", params);
  },

  async shutdown(params) {
    objectParams(params);
    shuttingDown = true;
    log("INFO", "shutdown requested");
    return {};
  },
};

function notImplemented(method, params) {
  const p = objectParams(params);
  const resource = str(p, "resource");
  checkResource(resource);
  throw new RpcError(METHOD_NOT_FOUND, `${resource} does not implement ${method}`);
}

// --- the health change -------------------------------------------------------

function startUnhealthyTimer() {
  if (unhealthyAfterMs === null || unhealthyTimer !== null) return;
  unhealthyTimer = setTimeout(() => {
    const last = [...devices.values()].pop();
    if (last === undefined || last.health === "UNHEALTHY") return;
    last.health = "UNHEALTHY";
    log("WARNING", `device '${last.id}' is now UNHEALTHY`);
    notify("health_changed", { resource: RESOURCE, changes: [{ id: last.id, health: "UNHEALTHY" }] });
  }, unhealthyAfterMs);
  unhealthyTimer.unref();
}

// --- dispatch --------------------------------------------------------------

const inFlight = new Set();

function isValidId(id) {
  return typeof id === "string" || typeof id === "number" || id === null;
}

function reject(id, code, message) {
  log("WARNING", `rejected input: ${message}`);
  send({ jsonrpc: "2.0", id, error: { code, message } });
}

function receive(text) {
  let message;
  try {
    message = JSON.parse(text);
  } catch (err) {
    reject(null, PARSE_ERROR, `not JSON: ${err.message}`);
    return;
  }
  if (message === null || typeof message !== "object" || Array.isArray(message)) {
    reject(null, INVALID_REQUEST, Array.isArray(message) ? "batches are not supported" : "not a JSON-RPC 2.0 object");
    return;
  }
  const id = "id" in message && isValidId(message.id) ? message.id : null;
  if (message.jsonrpc !== "2.0") {
    reject(id, INVALID_REQUEST, "not a JSON-RPC 2.0 object");
    return;
  }
  if (!("method" in message)) {
    // This driver sends no requests, so no response is expected.
    if ("id" in message && ("result" in message || "error" in message)) {
      log("WARNING", `ignoring a response to unknown request id ${JSON.stringify(message.id)}`);
    } else {
      reject(id, INVALID_REQUEST, "neither a request nor a response");
    }
    return;
  }
  if (typeof message.method !== "string") {
    reject(id, INVALID_REQUEST, "method must be a string");
    return;
  }
  if (!("id" in message)) {
    // devshim defines no notifications to a driver.
    log("INFO", `ignoring notification '${message.method}'`);
    return;
  }
  if (!isValidId(message.id)) {
    reject(null, INVALID_REQUEST, "id must be a string, a number or null");
    return;
  }
  // Each request runs on its own: its answer goes out as soon as it is done,
  // whatever else is still in flight.
  const task = answer(message.id, message.method, message.params);
  inFlight.add(task);
  task.finally(() => inFlight.delete(task));
}

async function answer(id, method, params) {
  const response = { jsonrpc: "2.0", id };
  const handler = Object.prototype.hasOwnProperty.call(methods, method) ? methods[method] : undefined;
  if (handler === undefined) {
    response.error = { code: METHOD_NOT_FOUND, message: `unknown method '${method}'` };
  } else {
    try {
      response.result = await handler(params);
    } catch (err) {
      if (err instanceof RpcError) {
        response.error = { code: err.code, message: err.message };
      } else {
        log("ERROR", `${method} failed: ${err && err.stack ? err.stack : err}`);
        response.error = { code: INTERNAL_ERROR, message: `${method} failed: ${err && err.message ? err.message : err}` };
      }
    }
  }
  if (method === "shutdown" && response.result !== undefined) {
    // Answer; once the answer is on the pipe, let the requests still in
    // flight answer too, then flush and exit.
    send(response, async () => {
      await Promise.allSettled([...inFlight]);
      exitAfterFlush(0);
    });
    return;
  }
  send(response);
  if (method === "initialize" && response.result !== undefined) startUnhealthyTimer();
}

// --- input: bytes -> lines ---------------------------------------------------
//
// stdin arrives in chunks of any size: a chunk may hold many lines, part of
// one, or end inside a multi-byte UTF-8 character. Chunks are kept as raw
// bytes until a "\n" completes a line; only then is the line decoded.

const decoder = new TextDecoder("utf-8", { fatal: true });
let pending = []; // chunks of the current, unfinished line
let pendingBytes = 0;
let discarding = false; // inside an over-long line: drop bytes up to its "\n"

function onLine(bytes) {
  let text;
  try {
    text = decoder.decode(bytes);
  } catch {
    reject(null, PARSE_ERROR, "not JSON: the line is not valid UTF-8");
    return;
  }
  if (text.trim() === "") return;
  if (shuttingDown) {
    log("WARNING", "input after shutdown ignored");
    return;
  }
  receive(text);
}

function tooLong() {
  reject(null, PARSE_ERROR, `a message is longer than the ${MAX_LINE_BYTES}-byte limit`);
}

function onChunk(chunk) {
  let start = 0;
  while (start < chunk.length) {
    const nl = chunk.indexOf(0x0a, start);
    if (nl === -1) {
      const rest = chunk.subarray(start);
      if (!discarding) {
        pending.push(rest);
        pendingBytes += rest.length;
        if (pendingBytes > MAX_LINE_BYTES) {
          pending = [];
          pendingBytes = 0;
          discarding = true;
          tooLong();
        }
      }
      return;
    }
    const piece = chunk.subarray(start, nl);
    start = nl + 1;
    if (discarding) {
      discarding = false;
      continue;
    }
    if (pendingBytes + piece.length > MAX_LINE_BYTES) {
      pending = [];
      pendingBytes = 0;
      tooLong();
      continue;
    }
    const line = pending.length === 0 ? piece : Buffer.concat([...pending, piece]);
    pending = [];
    pendingBytes = 0;
    enqueue(line);
  }
}

// Complete lines wait here and are dispatched one per event-loop turn, so a
// request that completes at once is answered before the next line is read
// (answers of quick requests come out in request order), while a slow one
// (it awaits) never holds up those behind it. stdin pauses while the queue
// is long.
const QUEUE_HIGH = 1024;
let queue = [];
let queueHead = 0;
let pumping = false;
let stdinEnded = false;

function enqueue(line) {
  queue.push(line);
  if (queue.length - queueHead >= QUEUE_HIGH) process.stdin.pause();
  if (!pumping) pump();
}

async function pump() {
  pumping = true;
  while (queueHead < queue.length) {
    const line = queue[queueHead];
    queue[queueHead++] = undefined;
    onLine(line);
    await new Promise((resolve) => setImmediate(resolve));
  }
  queue = [];
  queueHead = 0;
  pumping = false;
  if (stdinEnded) finish();
  else if (process.stdin.isPaused()) process.stdin.resume();
}

let finishing = false;
async function finish() {
  if (finishing) return;
  finishing = true;
  // stdin closed and every line dispatched: finish what is in flight, flush, exit.
  await Promise.allSettled([...inFlight]);
  log("INFO", "stdin closed; exiting");
  exitAfterFlush(0);
}

process.stdin.on("data", onChunk);
process.stdin.on("end", () => {
  stdinEnded = true;
  // A last line without its "\n" is still read.
  if (!discarding && pendingBytes > 0) {
    const line = Buffer.concat(pending);
    pending = [];
    pendingBytes = 0;
    enqueue(line);
  } else if (!pumping) {
    finish();
  }
});
process.stdin.on("error", (err) => {
  log("ERROR", `stdin: ${err.message}; exiting`);
  exitAfterFlush(1);
});

log("INFO", `serving ${RESOURCE}: ${deviceIds.join(",") || "(no devices)"}`);
