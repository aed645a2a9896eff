// A kafkajs transactional producer that tests/e2e/test_transactions.py steers one step at a time:
//   node txn_kafkajs.js NODE_MODULES BOOTSTRAP TRANSACTIONAL_ID
// Reads one JSON command a line on stdin, answers each with one JSON line on stdout
// ({"ok": true} or {"ok": false, "error": "..."}), so the test can kill the server between steps:
//   {"op": "begin", "topic": T, "messages": [{"partition": P, "value": V}, ...],
//    "offsets": {"group": G, "topic": T2, "partition": P2, "offset": "N"}}
//       a new transaction: the records (acks=all, answered once the broker has them) and the
//       consumed offsets (AddOffsetsToTxn + TxnOffsetCommit); the transaction stays open;
//   {"op": "commit"} / {"op": "abort"}: EndTxn;
//   {"op": "close"}: disconnect and exit 0.
"use strict";
const path = require("path");
const readline = require("readline");

const { Kafka, logLevel } = require(path.join(process.argv[2], "kafkajs"));
const [bootstrap, transactionalId] = process.argv.slice(3);

// Retries span a server restart (the broker listens again within seconds; Spark comes later).
const kafka = new Kafka({ clientId: "test-transactions-kafkajs", brokers: [bootstrap], logLevel: logLevel.NOTHING,
                          connectionTimeout: 10000, requestTimeout: 60000,
                          retry: { retries: 12, initialRetryTime: 300, maxRetryTime: 5000 } });
// transactionTimeout: longer than a restart on a loaded machine takes, so the coordinator does not
// abort the transaction open across it.
const producer = kafka.producer({ transactionalId, idempotent: true, maxInFlightRequests: 1,
                                  transactionTimeout: 120000 });
let transaction = null;

const steps = {
  begin: async (cmd) => {
    transaction = await producer.transaction();
    await transaction.send({ topic: cmd.topic, acks: -1, messages: cmd.messages.map(
      (m) => ({ partition: m.partition, value: m.value })) });
    const o = cmd.offsets;
    await transaction.sendOffsets({ consumerGroupId: o.group, topics: [
      { topic: o.topic, partitions: [{ partition: o.partition, offset: o.offset }] }] });
  },
  commit: async () => { await transaction.commit(); transaction = null; },
  abort: async () => { await transaction.abort(); transaction = null; },
  close: async () => { await producer.disconnect(); },
};

function describe(error) {
  const cause = error.originalError || error.cause;
  const text = `${error.name || "Error"}: ${error.message}`;
  return cause && cause.message && !text.includes(cause.message) ? `${text} (${cause.message})` : text;
}

(async () => {
  await producer.connect();
  process.stdout.write(JSON.stringify({ ok: true, ready: true }) + "\n");
  const lines = readline.createInterface({ input: process.stdin });
  for await (const line of lines) {
    const cmd = JSON.parse(line);
    try {
      await steps[cmd.op](cmd);
      process.stdout.write(JSON.stringify({ ok: true, op: cmd.op }) + "\n");
    } catch (error) {
      process.stdout.write(JSON.stringify({ ok: false, op: cmd.op, error: describe(error) }) + "\n");
    }
    if (cmd.op === "close") break;
  }
  process.exit(0);
})().catch((error) => {
  process.stdout.write(JSON.stringify({ ok: false, error: describe(error) }) + "\n");
  process.exit(1);
});
