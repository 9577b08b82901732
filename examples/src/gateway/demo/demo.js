// The tower-window gateway demo: a client of the `/ws` room protocol
// (examples/README.md). No build step, no dependency, nothing fetched from
// anywhere but the gateway nodes listed in the page.
//
// Page parameters (all optional): ?tenant=T&user=U&room=R
//   &nodes=http://127.0.0.1:3001,http://127.0.0.1:3002  (default: this page's origin)
//   &autoconnect=1
//
// Stable hooks for tests: ids in index.html, and data attributes:
//   #status[data-state]              idle | connecting | open | reconnecting | closed
//   body[data-node]                  the node URL of the open socket
//   #messages li[data-id][data-from][data-history]
//   #recovery[data-state][data-count][data-reason]   recovered | resync
//   #notices li[data-type]           rate_limited | resync | recovered | duplicate | close | error
//   #quotas tr[data-quota][data-remaining][data-limit]
//   #denials[data-audit]             unknown | on | off | unavailable
//   #denials tr[data-at][data-subject][data-quota][data-source]   the tenant's last denials, newest first
//   #presence li[data-user][data-online][data-connections]
"use strict";

(function () {
  const $ = (id) => document.getElementById(id);
  const params = new URLSearchParams(location.search);

  // Reconnect backoff: 250 ms doubling to 4 s, with jitter.
  const BACKOFF_MIN_MS = 250;
  const BACKOFF_MAX_MS = 4000;
  const POLL_MS = 2000;
  const MAX_PRESENCE_USERS = 20;
  const MAX_MESSAGES = 500;
  const MAX_NOTICES = 100;

  const state = {
    nodes: [],
    nodeIndex: 0,
    socket: null,
    wanted: false, // the user asked to be connected
    attempt: 0,
    reconnectTimer: null,
    pollTimer: null,
    polling: false,
    tenant: "",
    user: "",
    room: "",
    // The resume position: (epoch, last event id). `lastEventId` is null
    // until the first `joined` or event; "" means "the room was empty".
    epoch: null,
    lastEventId: null,
    resuming: false,
    seen: new Set(),
    users: new Set(),
    outbox: [], // sent while disconnected; flushed on open (ids dedupe a resend)
    quotas: new Map(),
    counter: 0,
  };

  function parseNodes(text) {
    const nodes = text
      .split(",")
      .map((s) => s.trim().replace(/\/+$/, ""))
      .filter((s) => /^https?:\/\/[^/]+$/.test(s));
    return nodes.length ? nodes : [location.origin];
  }

  function wsUrl(node) {
    const url = new URL("/ws", node.replace(/^http/, "ws"));
    url.searchParams.set("tenant", state.tenant);
    url.searchParams.set("user", state.user);
    url.searchParams.set("room", state.room);
    if (state.epoch !== null && state.lastEventId !== null) {
      url.searchParams.set("last_event_id", state.lastEventId);
      url.searchParams.set("epoch", state.epoch);
    }
    return url.toString();
  }

  function currentNode() {
    return state.nodes[state.nodeIndex % state.nodes.length];
  }

  function setStatus(s, detail) {
    const el = $("status");
    el.dataset.state = s;
    el.textContent = detail ? `${s} · ${detail}` : s;
  }

  function showPosition() {
    $("epoch").textContent = state.epoch ?? "–";
    $("last-event-id").textContent = state.lastEventId || "–";
  }

  function notice(type, text) {
    const li = document.createElement("li");
    li.dataset.type = type;
    li.textContent = `${new Date().toLocaleTimeString()} ${text}`;
    const list = $("notices");
    list.prepend(li);
    while (list.children.length > MAX_NOTICES) list.lastChild.remove();
  }

  function setRecovery(kind, text, attrs) {
    const el = $("recovery");
    el.dataset.state = kind;
    delete el.dataset.count;
    delete el.dataset.reason;
    Object.assign(el.dataset, attrs);
    el.textContent = text;
  }

  // `data` is the message text the sender sent; the demo sends
  // {"id": ..., "text": ...}, other clients may send anything.
  function messageText(data) {
    try {
      const parsed = JSON.parse(data);
      if (parsed && typeof parsed.text === "string") return parsed.text;
    } catch (_) {
      /* plain text */
    }
    return String(data);
  }

  function addEvent(ev) {
    if (state.seen.has(ev.id)) return; // never shown twice
    state.seen.add(ev.id);
    const li = document.createElement("li");
    li.dataset.id = ev.id;
    li.dataset.from = ev.from;
    li.dataset.history = state.resuming ? "true" : "false";
    if (ev.from === state.user) li.classList.add("mine");
    const from = document.createElement("span");
    from.className = "from";
    from.textContent = ev.from;
    const id = document.createElement("span");
    id.className = "id";
    id.textContent = ev.id;
    const text = document.createElement("span");
    text.className = "text";
    text.textContent = messageText(ev.data);
    li.append(id, from, text);
    const list = $("messages");
    list.append(li);
    while (list.children.length > MAX_MESSAGES) list.firstChild.remove();
    list.scrollTop = list.scrollHeight;
    state.lastEventId = ev.id;
    if (ev.epoch) state.epoch = ev.epoch;
    if (ev.from && !state.users.has(ev.from)) {
      state.users.add(ev.from);
      renderPresenceSkeleton();
    }
    showPosition();
  }

  function onMessage(raw) {
    let msg;
    try {
      msg = JSON.parse(raw);
    } catch (_) {
      msg = null;
    }
    if (!msg || typeof msg.type !== "string") {
      const li = document.createElement("li");
      li.className = "raw";
      li.textContent = String(raw);
      $("messages").append(li);
      return;
    }
    switch (msg.type) {
      case "joined":
        if (state.epoch !== null && msg.epoch !== state.epoch && !state.resuming) {
          // A new epoch with no resync seen: the position is void.
          state.lastEventId = null;
        }
        state.epoch = msg.epoch;
        if (state.lastEventId === null) state.lastEventId = msg.last_event_id ?? "";
        showPosition();
        break;
      case "event":
        addEvent(msg);
        break;
      case "recovered":
        state.resuming = false;
        setRecovery("recovered", `recovered ${msg.count} messages`, { count: String(msg.count) });
        notice("recovered", `recovered ${msg.count} messages on ${currentNode()}`);
        break;
      case "resync":
        state.resuming = false;
        // History since our position is gone: start again from live events.
        state.lastEventId = null;
        setRecovery("resync", `history lost: resynced (${msg.reason})`, {
          reason: String(msg.reason),
        });
        notice("resync", `history lost: resynced (${msg.reason})`);
        break;
      case "rate_limited": {
        const retry = Number(msg.retry_after_ms) || 0;
        notice("rate_limited", `rate limited by "${msg.quota}": retry in ${retry} ms`);
        const q = state.quotas.get(msg.quota) || { limit: null };
        state.quotas.set(msg.quota, {
          ...q,
          remaining: 0,
          resetMs: retry,
          at: Date.now(),
          fromNotice: true,
        });
        renderQuotas();
        break;
      }
      case "duplicate":
        notice("duplicate", `duplicate message ${msg.id} not delivered again`);
        break;
      default:
        notice("error", `unknown message: ${raw.slice(0, 200)}`);
    }
  }

  function connect() {
    clearTimeout(state.reconnectTimer);
    if (!state.wanted) return;
    const node = currentNode();
    state.resuming = state.epoch !== null && state.lastEventId !== null;
    setStatus(state.attempt ? "reconnecting" : "connecting", node);
    let socket;
    try {
      socket = new WebSocket(wsUrl(node));
    } catch (error) {
      notice("error", `cannot open ${node}: ${error}`);
      scheduleReconnect();
      return;
    }
    state.socket = socket;
    socket.onopen = () => {
      if (state.socket !== socket) return;
      state.attempt = 0;
      document.body.dataset.node = node;
      $("node").textContent = node;
      setStatus("open", node);
      $("send-input").disabled = false;
      $("send-button").disabled = false;
      while (state.outbox.length && socket.readyState === WebSocket.OPEN) {
        socket.send(state.outbox.shift());
      }
      poll();
    };
    socket.onmessage = (event) => {
      if (state.socket === socket) onMessage(typeof event.data === "string" ? event.data : "");
    };
    socket.onclose = (event) => {
      if (state.socket !== socket) return;
      state.socket = null;
      delete document.body.dataset.node;
      $("send-button").disabled = true;
      if (event.code !== 1000 || event.reason) {
        notice("close", `closed by ${node}: ${event.code}${event.reason ? " " + event.reason : ""}`);
      }
      if (state.wanted) {
        scheduleReconnect();
      } else {
        setStatus("closed");
      }
    };
  }

  function scheduleReconnect() {
    state.socket = null;
    // Try the next node: the one we lost may be gone.
    state.nodeIndex = (state.nodeIndex + 1) % state.nodes.length;
    const base = Math.min(BACKOFF_MAX_MS, BACKOFF_MIN_MS * 2 ** Math.min(state.attempt, 5));
    const wait = Math.round(base / 2 + Math.random() * (base / 2));
    state.attempt += 1;
    setStatus("reconnecting", `${currentNode()} in ${wait} ms`);
    state.reconnectTimer = setTimeout(connect, wait);
  }

  function send(text) {
    state.counter += 1;
    const id = `${state.user}-${Date.now().toString(36)}-${state.counter}`;
    const frame = JSON.stringify({ id, text });
    if (state.socket && state.socket.readyState === WebSocket.OPEN) {
      state.socket.send(frame);
    } else {
      state.outbox.push(frame);
    }
  }

  // ---- quotas: GET /api/quota (a peek: consumes none of the user's quotas)

  // `"name";q=10;w=60, "other";q=5;w=1` → Map(name → {q, w})
  function parseList(header) {
    const out = new Map();
    if (!header) return out;
    for (const item of header.split(",")) {
      const m = item.trim().match(/^"([^"]*)"(.*)$/);
      if (!m) continue;
      const fields = {};
      for (const p of m[2].split(";")) {
        const [k, v] = p.split("=");
        if (k && v !== undefined) fields[k.trim()] = Number(v);
      }
      out.set(m[1], fields);
    }
    return out;
  }

  async function pollQuota(node) {
    const url = new URL("/api/quota", node);
    url.searchParams.set("tenant", state.tenant);
    url.searchParams.set("user", state.user);
    const response = await fetch(url, { cache: "no-store" });
    if (!response.ok) throw new Error(`${response.status}`);
    const body = await response.json();
    const policy = parseList(response.headers.get("ratelimit-policy"));
    const tightest = parseList(response.headers.get("ratelimit"));
    const now = Date.now();
    for (const [name, q] of Object.entries(body.quotas || {})) {
      state.quotas.set(name, {
        limit: q.limit,
        remaining: q.remaining,
        resetMs: q.reset_after_ms,
        window: policy.get(name)?.w,
        at: now,
      });
    }
    // The RateLimit header names the tightest quota; it agrees with the body.
    for (const [name, f] of tightest) {
      const q = state.quotas.get(name);
      if (q && Number.isFinite(f.r)) q.remaining = f.r;
    }
    $("quota-source").dataset.node = node;
    renderQuotas();
    renderDenials(body);
  }

  // ---- the tenant's last denials: in the same answer (gateway --audit)

  function renderDenials(body) {
    const table = $("denials");
    const audit = typeof body.audit === "string" ? body.audit : "off";
    table.dataset.audit = audit;
    const rows = $("denials").tBodies[0];
    if (audit === "unavailable") {
      // Keep what was shown; the next poll tries again.
      $("denials-hint").textContent = "the audit trail could not be read just now";
      return;
    }
    rows.replaceChildren();
    if (audit !== "on") {
      $("denials-hint").textContent = "the audit trail is off: start the gateway with --audit";
      return;
    }
    const denials = Array.isArray(body.denials) ? body.denials : [];
    $("denials-hint").textContent = denials.length
      ? `tenant ${state.tenant}, newest first, from the audit trail`
      : `no denial recorded for tenant ${state.tenant}`;
    for (const d of denials) {
      const tr = document.createElement("tr");
      const at = Number(d.at_micros) || 0;
      tr.dataset.at = String(at);
      tr.dataset.subject = String(d.subject ?? "");
      tr.dataset.quota = String(d.quota ?? "");
      tr.dataset.source = String(d.source ?? "");
      tr.innerHTML = "<td></td><td></td><td></td><td></td>";
      tr.cells[0].textContent = new Date(at / 1000).toLocaleTimeString();
      tr.cells[1].textContent = tr.dataset.subject;
      tr.cells[1].title = tr.dataset.subject;
      tr.cells[2].textContent = tr.dataset.quota;
      tr.cells[3].textContent = tr.dataset.source;
      rows.append(tr);
    }
  }

  function renderQuotas() {
    const body = $("quotas").tBodies[0];
    body.replaceChildren();
    for (const [name, q] of [...state.quotas.entries()].sort()) {
      const tr = document.createElement("tr");
      const left = Math.max(0, (q.resetMs || 0) - (Date.now() - q.at));
      // A quota known only from a rate_limited notice: past its retry time
      // its state is unknown until the next notice.
      const unknown = q.fromNotice && left === 0;
      tr.dataset.quota = name;
      tr.dataset.remaining = unknown ? "" : String(q.remaining);
      if (q.limit !== null && q.limit !== undefined) tr.dataset.limit = String(q.limit);
      tr.dataset.exhausted = !unknown && q.remaining === 0 ? "true" : "false";
      const pct = q.limit ? Math.round((100 * q.remaining) / q.limit) : 0;
      tr.innerHTML = "<td></td><td></td><td></td>";
      tr.cells[0].textContent = name;
      const shown = unknown ? "–" : q.remaining;
      tr.cells[1].textContent = q.limit ? `${shown} / ${q.limit}` : `${shown}`;
      const bar = document.createElement("span");
      bar.className = "bar";
      const fill = document.createElement("i");
      fill.style.width = `${pct}%`;
      bar.append(fill);
      tr.cells[1].append(bar);
      tr.cells[2].textContent = `${(left / 1000).toFixed(1)} s`;
      body.append(tr);
    }
  }

  // ---- presence: GET /presence?tenant=T&user=U for each user seen in the room

  function renderPresenceSkeleton() {
    const list = $("presence");
    for (const user of [...state.users].slice(0, MAX_PRESENCE_USERS)) {
      if (list.querySelector(`li[data-user="${CSS.escape(user)}"]`)) continue;
      const li = document.createElement("li");
      li.dataset.user = user;
      li.dataset.online = "unknown";
      li.textContent = user;
      list.append(li);
    }
  }

  async function pollPresence(node) {
    renderPresenceSkeleton();
    const users = [...state.users].slice(0, MAX_PRESENCE_USERS);
    await Promise.all(
      users.map(async (user) => {
        const url = new URL("/presence", node);
        url.searchParams.set("tenant", state.tenant);
        url.searchParams.set("user", user);
        const li = $("presence").querySelector(`li[data-user="${CSS.escape(user)}"]`);
        try {
          const response = await fetch(url, { cache: "no-store" });
          if (!response.ok) throw new Error(`${response.status}`);
          const body = await response.json();
          li.dataset.online = body.online ? "true" : "false";
          li.dataset.connections = String(body.connections ?? 0);
          li.textContent = `${user} · ${body.online ? `online (${body.connections})` : "offline"}`;
        } catch (error) {
          li.dataset.online = "unknown";
          li.textContent = `${user} · presence unavailable`;
        }
      }),
    );
  }

  async function poll() {
    if (!state.wanted || state.polling) return; // one poll loop at a time
    state.polling = true;
    clearTimeout(state.pollTimer);
    try {
      // Ask the node we are connected to (or would connect to next).
      const node = document.body.dataset.node || currentNode();
      try {
        await pollQuota(node);
        delete $("quota-source").dataset.error;
      } catch (error) {
        $("quota-source").dataset.error = String(error);
      }
      await pollPresence(node);
    } finally {
      state.polling = false;
    }
    if (state.wanted) state.pollTimer = setTimeout(poll, POLL_MS);
  }

  // ---- wiring

  function start(event) {
    if (event) event.preventDefault();
    const tenant = $("tenant").value.trim();
    const user = $("user").value.trim();
    const room = $("room").value.trim();
    if (!tenant || !user || !/^[A-Za-z0-9_.-]{1,64}$/.test(room)) {
      notice("error", "tenant, user and a room name of 1-64 [A-Za-z0-9_.-] are required");
      return;
    }
    stop();
    Object.assign(state, {
      tenant,
      user,
      room,
      nodes: parseNodes($("nodes").value),
      nodeIndex: 0,
      wanted: true,
      attempt: 0,
      epoch: null,
      lastEventId: null,
      resuming: false,
    });
    state.seen.clear();
    state.users = new Set([user]);
    state.quotas.clear();
    $("denials").tBodies[0].replaceChildren();
    $("denials").dataset.audit = "unknown";
    $("messages").replaceChildren();
    $("presence").replaceChildren();
    setRecovery("none", "", {});
    $("connect").disabled = true;
    $("disconnect").disabled = false;
    document.title = `${user} in ${room} · tower-window demo`;
    connect();
    poll();
  }

  function stop() {
    state.wanted = false;
    clearTimeout(state.reconnectTimer);
    clearTimeout(state.pollTimer);
    if (state.socket) {
      const socket = state.socket;
      state.socket = null;
      socket.close(1000);
    }
    delete document.body.dataset.node;
    $("send-input").disabled = true;
    $("send-button").disabled = true;
    $("connect").disabled = false;
    $("disconnect").disabled = true;
    setStatus("closed");
  }

  $("settings").addEventListener("submit", start);
  $("disconnect").addEventListener("click", stop);
  $("send-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const input = $("send-input");
    const text = input.value;
    if (!text) return;
    send(text);
    input.value = "";
  });

  for (const name of ["tenant", "user", "room", "nodes"]) {
    if (params.has(name)) $(name).value = params.get(name);
  }
  if (!$("nodes").value) $("nodes").value = location.origin;
  if (!$("user").value) $("user").value = `guest-${Math.random().toString(36).slice(2, 7)}`;
  window.towerWindowDemo = state; // for people poking at it in devtools
  if (params.get("autoconnect") === "1") start();
})();
