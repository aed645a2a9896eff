// The matrix's kafkajs driver (1.16 and 2.x): node driver_kafkajs.js NODE_MODULES INPUT.json
// Prints one JSON line per capability, like tests/compat/driver_common.py.
"use strict";
const fs = require("fs");
const path = require("path");

const kafkajs = require(path.join(process.argv[2], "kafkajs"));
const { Kafka, logLevel } = kafkajs;
const cfg = JSON.parse(fs.readFileSync(process.argv[3], "utf8"));
const T = cfg.timeout_s * 1000;
const CAPABILITIES = ["produce", "idempotent", "group-consume", "scram-tls", "create-topic", "transactions"];

const common = { clientId: cfg.client, logLevel: logLevel.NOTHING, connectionTimeout: 10000,
                 requestTimeout: T, retry: { retries: 3 } };
const plain = new Kafka({ ...common, brokers: [cfg.plaintext] });
const scram = new Kafka({ ...common, brokers: [cfg.sasl_ssl], ssl: { ca: [fs.readFileSync(cfg.ca, "utf8")] },
                          sasl: { mechanism: cfg.mechanism.toLowerCase(), username: cfg.user,
                                  password: cfg.password } });

const valuesFor = (capability, n = cfg.n) => Array.from({ length: n }, (_, i) => `${cfg.client}-${capability}-${i}`);

function within(promise, ms, what) {
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: no answer within ${ms / 1000} s`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

async function produce(kafka, topic, values, options = {}) {
  const producer = kafka.producer({ allowAutoTopicCreation: true, ...options });
  await producer.connect();
  try {
    await producer.send({ topic, acks: -1, messages: values.map((value) => ({ value, partition: 0 })) });
  } finally {
    await producer.disconnect();
  }
}

// kafkajs has no assign(): read back through a consumer group of its own, from the beginning,
// until `n` values are in and the group has reached the partition's end.
async function readBack(kafka, topic, n, groupSuffix, options = {}) {
  const consumer = kafka.consumer({ groupId: `${cfg.client}-reader-${groupSuffix}`, ...options });
  const out = [];
  await consumer.connect();
  try {
    await consumer.subscribe({ topic, fromBeginning: true });
    await new Promise((resolve, reject) => {
      consumer.run({
        eachBatch: async ({ batch }) => {
          for (const message of batch.messages) out.push(message.value.toString());
          const end = BigInt(batch.highWatermark);
          const next = batch.messages.length ? BigInt(batch.lastOffset()) + 1n : 0n;
          if (out.length >= n && next >= end) resolve();
        },
      }).catch(reject);
    });
  } finally {
    await consumer.disconnect();
  }
  return out;
}

const capabilities = {
  "produce": () => produce(plain, cfg.topics["produce"], valuesFor("produce"), { idempotent: false }),
  "idempotent": () => produce(plain, cfg.topics["idempotent"], valuesFor("idempotent"),
                              { idempotent: true, maxInFlightRequests: 1 }),
  "group-consume": async () => {
    const consumer = plain.consumer({ groupId: cfg.group });
    const out = [];
    await consumer.connect();
    try {
      await consumer.subscribe({ topic: cfg.topics["group-consume"], fromBeginning: true });
      await new Promise((resolve, reject) => {
        consumer.run({
          autoCommit: false,
          eachMessage: async ({ topic, partition, message }) => {
            out.push(message.value.toString());
            if (out.length === cfg.n) {
              const offset = (BigInt(message.offset) + 1n).toString();
              await consumer.commitOffsets([{ topic, partition, offset }]);
              resolve();
            }
          },
        }).catch(reject);
      });
    } finally {
      await consumer.disconnect();
    }
    return out;
  },
  "scram-tls": async () => {
    const topic = cfg.topics["scram-tls"];
    await produce(scram, topic, valuesFor("scram-tls"));
    return readBack(scram, topic, cfg.n, "scram");
  },
  "create-topic": async () => {
    const admin = plain.admin();
    await admin.connect();
    try {
      const created = await admin.createTopics({
        topics: [{ topic: cfg.topics["create-topic"], numPartitions: 3, replicationFactor: 1 }], waitForLeaders: true });
      if (!created) throw new Error("createTopics answered false (the topic existed)");
    } finally {
      await admin.disconnect();
    }
  },
  "transactions": async () => {
    const topic = cfg.topics["transactions"];
    const producer = plain.producer({ transactionalId: cfg.transactional_id, idempotent: true,
                                      maxInFlightRequests: 1, transactionTimeout: 10000,
                                      retry: { retries: 1 } });
    const ms = cfg.txn_timeout_s * 1000;
    await within(producer.connect(), ms, "connect");
    try {
      for (const [outcome, values] of [["commit", valuesFor("transactions-commit", 3)],
                                       ["abort", valuesFor("transactions-abort", 2)]]) {
        const transaction = await within(producer.transaction(), ms, "transaction (InitProducerId)");
        await transaction.send({ topic, messages: values.map((value) => ({ value, partition: 0 })) });
        await within(outcome === "commit" ? transaction.commit() : transaction.abort(), ms, outcome);
      }
    } finally {
      await producer.disconnect();
    }
    return readBack(plain, topic, 3, "txn", { readUncommitted: false });
  },
};

function describe(error) {
  const text = `${error.name || "Error"}: ${error.message}`;
  const cause = error.originalError || error.cause;
  return (cause && cause.message && !text.includes(cause.message) ? `${text} (${cause.message})` : text).slice(0, 300);
}

(async () => {
  const version = JSON.parse(fs.readFileSync(path.join(process.argv[2], "kafkajs", "package.json"), "utf8")).version;
  process.stdout.write(JSON.stringify({ capability: "version", ok: true, detail: version, values: null }) + "\n");
  for (const capability of CAPABILITIES) {
    if (!cfg.capabilities.includes(capability)) continue;
    const started = Date.now();
    let line;
    try {
      const values = await within(capabilities[capability](), T, "the capability");
      line = { capability, ok: true, detail: `${((Date.now() - started) / 1000).toFixed(1)} s`,
               values: values === undefined ? null : values };
    } catch (error) {
      line = { capability, ok: false, detail: describe(error), values: null, trace: String(error.stack).slice(0, 2000) };
    }
    process.stdout.write(JSON.stringify(line) + "\n");
  }
  process.exit(0);
})();
