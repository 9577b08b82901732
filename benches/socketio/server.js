// One Socket.IO 4 node for the rooms comparison (issue 24): rooms shared
// with the other nodes through @socket.io/redis-streams-adapter on the
// `redis` client, as its README sets it up, with default options.
//
//   node server.js PORT REDIS_URL
//
// A socket joins the room named by its `room` query parameter on connect.
// Its `pub` events are broadcast to that room on every node, the sender
// included (as the gateway's rooms do), as `event` {room, from, data}.
// Prints "listening PORT" once it serves, so run.sh can wait for it.
"use strict";

const { createServer } = require("node:http");
const { createClient } = require("redis");
const { Server } = require("socket.io");
const { createAdapter } = require("@socket.io/redis-streams-adapter");

const ROOM = /^[A-Za-z0-9_.-]{1,64}$/;

async function main() {
  const [port, redisUrl] = process.argv.slice(2);
  if (!port || !redisUrl) {
    console.error("usage: node server.js PORT REDIS_URL");
    process.exit(2);
  }
  const redis = createClient({ url: redisUrl });
  redis.on("error", (error) => console.error("redis:", error.message));
  await redis.connect();

  const http = createServer();
  const io = new Server(http, {
    adapter: createAdapter(redis),
    // The load client speaks WebSocket only, like the gateway's clients;
    // long-polling would only add an upgrade round trip at connect.
    transports: ["websocket"],
  });
  io.on("connection", (socket) => {
    const { room, user } = socket.handshake.query;
    if (typeof room !== "string" || !ROOM.test(room)) {
      socket.disconnect(true);
      return;
    }
    socket.join(room);
    socket.on("pub", (data) => {
      if (typeof data === "string") {
        io.to(room).emit("event", { room, from: String(user), data });
      }
    });
  });
  http.listen(Number(port), "127.0.0.1", () => console.log(`listening ${port}`));
  const stop = () => {
    io.close();
    redis.destroy?.() ?? redis.disconnect();
    process.exit(0);
  };
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
