// Package health serves kscope runners' liveness and readiness as the
// probes Kubernetes calls: GET /livez and GET /readyz answer 200 when every
// runner is live (ready), and 503 otherwise, with a JSON body that says,
// per runner, why not:
//
//	{"status":"unready","checks":[{"runner":"payments","ok":false,
//	  "reasons":["no broker answered for 6s: dial tcp ...: connection refused"]}]}
//
// What live and ready mean is [consumer.Health]'s: a runner is live unless
// Run returned an error or its poll loop is stuck, so that a liveness probe
// restarts a process whose consumer is gone but never one that waits for a
// broker or a database; it is ready while Run runs, the member has joined
// its group, its scope started (the DB scope's schema checked, the Kafka
// scope's version changelogs restored), the brokers answer and nothing
// holds or is about to stop it. A consumer.Runner, a dbscope.Runner and a txn.Runner
// all have the Health method the handler reads.
package health
