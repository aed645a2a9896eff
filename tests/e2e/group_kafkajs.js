// A kafkajs consumer group of MEMBERS consumers in one process, for tests/e2e/test_failover.py:
//   node group_kafkajs.js NODE_MODULES BOOTSTRAP GROUP TOPIC MEMBERS
// Each member consumes TOPIC from the beginning (auto-commit) and prints one JSON line on stdout per
// record, {"m": MEMBER, "p": PARTITION, "o": "OFFSET", "v": VALUE}, and one per group join,
// {"m": MEMBER, "join": [ASSIGNED PARTITIONS]}; lines from both members go out in the order
// they happened (one process, one stdout). A crash of a member ({"m": MEMBER, "crash": ERROR}) is
// followed by kafkajs' own restart (restartOnFailure). SIGTERM: disconnect every member, exit 0.
// kafkajs' own log goes to stderr, one JSON object a line (the test keeps stderr in kafkajs.log beside the
// brokers' logs): INFO and above (joins, crashes, batches filtered out, offset resets); with KAFKAJS_DEBUG=1
// in the environment DEBUG too: every request and answer, with its broker and error.
"use strict";
const path = require("path");

const { Kafka, logLevel, PartitionAssigners } = require(path.join(process.argv[2], "kafkajs"));
const [bootstrap, groupId, topic, members] = process.argv.slice(3);
// kafkajs' round robin under the protocol name librdkafka's has ("roundrobin"), so that
// confluent-kafka members (partition.assignment.strategy=roundrobin) share the group: both encode
// Kafka's ConsumerProtocol subscription and assignment, and whichever is the leader assigns.
const roundrobin = (config) => ({ ...PartitionAssigners.roundRobin(config), name: "roundrobin" });

// kafkajs looks for its group's coordinator only when it joins, or when the coordinator answers
// NOT_COORDINATOR: a member whose coordinator's host died keeps heartbeating that host, and reaches
// a coordinator again only when the host is back (the test restarts it about 20 s after the kill;
// the group moves back to it). To keep its member id across that, its session must outlast it:
// kafkajs' default session, 30 s (with 10 s sessions the survivor that loaded the group removed both
// kafkajs members before they could reach anyone). A request to a host whose link is down waits out
// requestTimeout (no reset), 5 s here so that heartbeats and fetches to other hosts go on. kafkajs
// refreshes its metadata after a fetch's timeout only at metadataMaxAge (default 5 min), and until
// then fetches a moved partition from the dead leader (the likely cause of a member that stopped
// fetching for minutes in one CI run with 30 s sessions, commit 3ff01a2): 5 s here.
const kafka = new Kafka({ clientId: "test-failover-kafkajs", brokers: bootstrap.split(","),
                          logLevel: process.env.KAFKAJS_DEBUG ? logLevel.DEBUG : logLevel.INFO,
                          logCreator: () => ({ namespace, level, label, log }) =>
                            process.stderr.write(JSON.stringify({ t: Date.now(), level: label, ns: namespace, ...log }) + "\n"),
                          connectionTimeout: 3000, requestTimeout: 5000,
                          retry: { retries: 30, initialRetryTime: 300, maxRetryTime: 3000 } });
const out = (obj) => process.stdout.write(JSON.stringify(obj) + "\n");
const consumers = [];

async function member(m) {
  const consumer = kafka.consumer({ groupId, sessionTimeout: 30000, heartbeatInterval: 1000,
                                    rebalanceTimeout: 30000, metadataMaxAge: 5000, retry: { retries: 30 },
                                    partitionAssigners: [roundrobin] });
  consumers.push(consumer);
  consumer.on(consumer.events.GROUP_JOIN, (e) => out({ m, join: (e.payload.memberAssignment || {})[topic] || [] }));
  consumer.on(consumer.events.CRASH, (e) => out({ m, crash: String(e.payload.error) }));
  // kafkajs logs a request that timed out at DEBUG only: one WARN line each, for the test's summary.
  consumer.on(consumer.events.REQUEST_TIMEOUT, (e) => process.stderr.write(JSON.stringify(
    { t: Date.now(), level: "WARN", message: `request timed out: ${e.payload.apiName} to ${e.payload.broker}`, m }) + "\n"));
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  await consumer.run({ eachMessage: async ({ partition, message }) =>
    out({ m, p: partition, o: message.offset, v: message.value.toString() }) });
}

process.on("SIGTERM", async () => {
  await Promise.allSettled(consumers.map((c) => c.disconnect()));
  process.exit(0);
});
Promise.all(Array.from({ length: Number(members) }, (_, m) => member(m)))
  .then(() => out({ ready: true }))
  .catch((e) => { process.stderr.write(String(e.stack || e) + "\n"); process.exit(1); });
