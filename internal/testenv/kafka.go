package testenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/kscope-dev/kscope/internal/kread"
)

// Containers starts backends in containers. The integration module provides
// one backed by testcontainers.
type Containers interface {
	Kafka(ctx context.Context) (brokers []string, stop func(), err error)
	Postgres(ctx context.Context) (url string, stop func(), err error)
}

var (
	containersMu sync.Mutex
	containers   Containers
)

// UseContainers registers the container provider used when
// KSCOPE_TEST_CONTAINERS=1.
func UseContainers(c Containers) {
	containersMu.Lock()
	containers = c
	containersMu.Unlock()
}

func wantContainers() (Containers, error) {
	if os.Getenv("KSCOPE_TEST_CONTAINERS") != "1" {
		return nil, nil
	}
	containersMu.Lock()
	defer containersMu.Unlock()
	if containers == nil {
		return nil, errors.New(`KSCOPE_TEST_CONTAINERS=1 but no container provider is linked into this test binary: import _ "github.com/kscope-dev/kscope/kscopetest/containers" in a test file of the module (a Go module of its own: go get it)`)
	}
	return containers, nil
}

// Kafka is a Kafka backend: external brokers, a kfake cluster, an Apache
// Kafka cluster started from its Maven Central artifacts, or a container.
type Kafka struct {
	Brokers []string
	// Cluster is the in-process cluster, nil when the brokers are external,
	// Apache Kafka or in a container. Fault injection needs it.
	Cluster *kfake.Cluster
	// Apache is the Apache Kafka cluster this process started, nil for the
	// other backends. Broker kills and restarts need it.
	Apache *ApacheCluster
	// Kind says which backend this is: "external", "kfake", "apache" or
	// "container".
	Kind string

	adminMu sync.Mutex
	adminCl *kgo.Client
	retired []*kgo.Client
	swapped time.Time // when adminCl last replaced a client
	stop    func()
	once    sync.Once
	reap    reaper // members of killed processes, removed as their session expires (Departed)
}

// KafkaEnv is the environment variable that selects the Kafka backend when
// KAFKA_BROKERS is not set: "kfake" (or unset) for the in-process cluster,
// "apache" for Apache Kafka started from its Maven Central artifacts.
const KafkaEnv = "KSCOPE_KAFKA"

// KafkaKind returns the kind of backend StartKafka starts in this
// environment, without starting it: "external", "apache", "container" or
// "kfake".
func KafkaKind() (string, error) {
	if strings.TrimSpace(os.Getenv("KAFKA_BROKERS")) != "" {
		return "external", nil
	}
	switch v := strings.TrimSpace(os.Getenv(KafkaEnv)); v {
	case "apache":
		return "apache", nil
	case "", "kfake":
	default:
		return "", fmt.Errorf("testenv: %s=%q: want apache or kfake (or unset)", KafkaEnv, v)
	}
	if os.Getenv("KSCOPE_TEST_CONTAINERS") == "1" {
		return "container", nil
	}
	return "kfake", nil
}

// StartKafka returns a Kafka backend chosen as the package doc says. opts
// apply to a kfake cluster only; Apache Kafka starts as one node (see
// [StartApacheKafka] for a cluster of several), of the caller's own: the
// node the next call returns starts while the caller runs, and StopShared
// stops the one left over.
func StartKafka(ctx context.Context, opts ...kfake.Opt) (*Kafka, error) {
	kind, err := KafkaKind()
	if err != nil {
		return nil, err
	}
	switch kind {
	case "external":
		return newKafka(strings.Split(strings.TrimSpace(os.Getenv("KAFKA_BROKERS")), ","), nil, "external", func() {})
	case "apache":
		return startApacheOne(ctx)
	}
	if c, err := wantContainers(); err != nil {
		return nil, err
	} else if c != nil {
		brokers, stop, err := c.Kafka(ctx)
		if err != nil {
			return nil, fmt.Errorf("testenv: starting a Kafka container: %w", err)
		}
		return newKafka(brokers, nil, "container", stop)
	}
	base := []kfake.Opt{kfake.NumBrokers(1), kfake.DefaultNumPartitions(1),
		// Consumer-protocol (KIP-848) members reconcile an assignment
		// change at their next heartbeat: every 500 ms rather than the
		// default 5 s, and a fenced member's partitions move after 6 s
		// rather than 45 (as on the Apache Kafka test brokers).
		kfake.BrokerConfigs(map[string]string{
			"group.consumer.heartbeat.interval.ms": "500",
			"group.consumer.session.timeout.ms":    "6000",
		})}
	cl, err := kfake.NewCluster(append(base, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("testenv: starting an in-process kfake cluster: %w", err)
	}
	return newKafka(cl.ListenAddrs(), cl, "kfake", cl.Close)
}

func newKafka(brokers []string, c *kfake.Cluster, kind string, stop func()) (*Kafka, error) {
	adm, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		stop()
		return nil, err
	}
	return &Kafka{Brokers: brokers, Cluster: c, Kind: kind, adminCl: adm, stop: stop}, nil
}

// KafkaT starts a Kafka backend for one test and stops it when the test ends.
func KafkaT(t testing.TB, opts ...kfake.Opt) *Kafka {
	t.Helper()
	k, err := StartKafka(context.Background(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Close)
	return k
}

// ApacheKafkaT starts an Apache Kafka cluster for one test, whatever the
// environment selects, and stops it when the test ends. It is for tests
// that kill brokers; they need a JDK and Maven (see [ErrNoJava]).
func ApacheKafkaT(t testing.TB, o ApacheOptions) *Kafka {
	t.Helper()
	k, err := StartApacheKafka(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Close)
	return k
}

// Close stops the backend (a no-op for external brokers).
func (k *Kafka) Close() {
	k.once.Do(func() {
		k.stopReaping()
		k.adminMu.Lock()
		k.adminCl.Close()
		for _, cl := range k.retired {
			cl.Close()
		}
		k.adminMu.Unlock()
		k.stop()
	})
}

// Admin returns an admin client on the backend.
func (k *Kafka) Admin() *kadm.Client { return kadm.NewClient(k.admin()) }

func (k *Kafka) admin() *kgo.Client {
	k.adminMu.Lock()
	defer k.adminMu.Unlock()
	return k.adminCl
}

// checkAdmin replaces the admin client after err, when err says that a
// broker could not be dialed: franz-go keeps a group coordinator that died
// cached for the sharded requests (OffsetFetch, ListOffsets) and dials it
// until the client is closed, so a test that kills brokers would otherwise
// never read the group's offsets again. It returns err.
func (k *Kafka) checkAdmin(err error) error {
	var op *net.OpError
	if err == nil || !errors.As(err, &op) || op.Op != "dial" {
		return err
	}
	k.adminMu.Lock()
	defer k.adminMu.Unlock()
	// At most one new client a second: while a broker is down every
	// request fails to dial it, and the helpers poll.
	if time.Since(k.swapped) < time.Second {
		return err
	}
	fresh, nerr := kgo.NewClient(kgo.SeedBrokers(k.Brokers...))
	if nerr != nil {
		return err
	}
	// The old client is closed with the backend, not now: a request still
	// on it (a produce, say) must not fail because of the swap.
	k.retired = append(k.retired, k.adminCl)
	k.adminCl, k.swapped = fresh, time.Now()
	return err
}

// Client returns a new client on the backend's brokers; the caller closes it.
func (k *Kafka) Client(opts ...kgo.Opt) (*kgo.Client, error) {
	return kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(k.Brokers...)}, opts...)...)
}

// CreateTopic creates topic with the given partition count (replication
// factor 1 on kfake, the broker default elsewhere) and waits until every
// partition has a leader in the metadata: a real broker answers
// CreateTopics before the other brokers know the topic.
func (k *Kafka) CreateTopic(ctx context.Context, topic string, partitions int32) error {
	resp, err := k.Admin().CreateTopic(ctx, partitions, -1, nil, topic)
	if err != nil {
		return err
	}
	if resp.Err != nil {
		return resp.Err
	}
	return k.WaitTopic(ctx, topic, partitions)
}

// WaitTopic waits (bounded by ctx and 30 s) until topic has partitions
// partitions, each with a leader, in the metadata.
func (k *Kafka) WaitTopic(ctx context.Context, topic string, partitions int32) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		td, err := topicMetadata(ctx, k.admin(), topic)
		if err == nil {
			ready := len(td.Partitions) == int(partitions)
			for _, p := range td.Partitions {
				ready = ready && p.ErrorCode == 0 && p.Leader >= 0 && len(p.Replicas) > 0
			}
			if ready {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("testenv: topic %s has no leader for each of its %d partitions: %w", topic, partitions, ctx.Err())
		case <-time.After(20 * time.Millisecond): // the next metadata request
		}
	}
}

// topicMetadata asks a broker for topic's metadata now. kadm's Metadata
// answers from the client's cache for up to MetadataMinAge (5 s): a topic
// seen without its leaders just after it was created would stay so for
// those 5 s.
func topicMetadata(ctx context.Context, cl *kgo.Client, topic string) (kmsg.MetadataResponseTopic, error) {
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return kmsg.MetadataResponseTopic{}, err
	}
	for _, t := range resp.Topics {
		if t.Topic != nil && *t.Topic == topic {
			return t, kerr.ErrorForCode(t.ErrorCode)
		}
	}
	return kmsg.MetadataResponseTopic{}, fmt.Errorf("testenv: topic %s is not in the metadata", topic)
}

// Produce writes records synchronously and returns the first error.
func (k *Kafka) Produce(ctx context.Context, recs ...*kgo.Record) error {
	return k.checkAdmin(k.admin().ProduceSync(ctx, recs...).FirstErr())
}

// Fault installs faults on the in-process cluster. It fails when the backend
// is not kfake: a real broker cannot be told to fail on purpose.
func (k *Kafka) Fault(faults ...kfake.Fault) (*kfake.FaultHandle, error) {
	if k.Cluster == nil {
		return nil, fmt.Errorf("testenv: fault injection needs the in-process kfake backend, this one is %s", k.Kind)
	}
	return k.Cluster.Fault(faults...), nil
}

// CommittedOffsets returns the group's committed offset per partition of
// topic.
func (k *Kafka) CommittedOffsets(ctx context.Context, group, topic string) (map[int32]int64, error) {
	resp, err := k.Admin().FetchOffsets(ctx, group)
	if err != nil {
		return nil, k.checkAdmin(err)
	}
	if err := resp.Error(); err != nil {
		return nil, err
	}
	out := make(map[int32]int64)
	for p, o := range resp[topic] {
		out[p] = o.At
	}
	return out, nil
}

// EndOffsets returns the end offset (high watermark) per partition of topic.
func (k *Kafka) EndOffsets(ctx context.Context, topic string) (map[int32]int64, error) {
	resp, err := k.Admin().ListEndOffsets(ctx, topic)
	if err = k.checkAdmin(err); err != nil {
		return nil, err
	}
	if err := resp.Error(); err != nil {
		return nil, err
	}
	out := make(map[int32]int64)
	resp.Each(func(o kadm.ListedOffset) { out[o.Partition] = o.Offset })
	return out, nil
}

// ReadAll reads every record of topic, read_committed, from its start to
// the end offsets it has when called. Transaction markers and aborted
// records take offsets without being records: a partition is read to its end
// once a record or marker at its last offset has been seen.
func (k *Kafka) ReadAll(t testing.TB, topic string) []*kgo.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ends, err := k.EndOffsets(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	cl, err := k.Client(kgo.ConsumeTopics(topic), kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.KeepControlRecords())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var out []*kgo.Record
	err = kread.ToEnd(ctx, cl, map[string]map[int32]int64{topic: ends}, kread.Options{}, func(r *kgo.Record) error {
		out = append(out, r)
		return nil
	})
	if err != nil {
		t.Fatalf("reading %s to its end: %v", topic, err)
	}
	return out
}

// Header returns the value of r's last header named key ("" if none).
func Header(r *kgo.Record, key string) string {
	for i := len(r.Headers) - 1; i >= 0; i-- {
		if r.Headers[i].Key == key {
			return string(r.Headers[i].Value)
		}
	}
	return ""
}

// CaughtUp reports whether group's committed offsets reach the end of every
// partition of topic. It is false, not an error, while the group or its
// commits do not exist yet.
func (k *Kafka) CaughtUp(ctx context.Context, group, topic string) bool {
	ends, err := k.EndOffsets(ctx, topic)
	if err != nil {
		return false
	}
	com, err := k.CommittedOffsets(ctx, group, topic)
	if err != nil {
		return false
	}
	for p, e := range ends {
		if e > 0 && com[p] != e {
			return false
		}
	}
	return true
}

// OpenTransaction leaves a transaction of txnID open, as a Kafka-scope
// member that died between its TxnOffsetCommit and its EndTxn leaves it:
// recs produced in it, and group's offsets of topic's partitions
// committed at offset in it. The client is closed when the test ends,
// without ending the transaction.
func (k *Kafka) OpenTransaction(t testing.TB, txnID, group, topic string, partitions int32, offset int64, recs ...*kgo.Record) {
	t.Helper()
	ctx := context.Background()
	cl, err := k.Client(kgo.TransactionalID(txnID), kgo.TransactionTimeout(5*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	id, epoch, err := cl.ProducerID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	add := kmsg.NewPtrAddOffsetsToTxnRequest()
	add.TransactionalID, add.ProducerID, add.ProducerEpoch, add.Group = txnID, id, epoch, group
	addResp, err := add.RequestWith(ctx, cl)
	if err == nil {
		err = kerr.ErrorForCode(addResp.ErrorCode)
	}
	if err != nil {
		t.Fatalf("AddOffsetsToTxn: %v", err)
	}
	oc := kmsg.NewPtrTxnOffsetCommitRequest()
	oc.TransactionalID, oc.Group, oc.ProducerID, oc.ProducerEpoch, oc.Generation = txnID, group, id, epoch, -1
	td, err := k.Admin().ListTopics(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	ot := kmsg.NewTxnOffsetCommitRequestTopic()
	ot.Topic, ot.TopicID = topic, td[topic].ID
	for p := range partitions {
		op := kmsg.NewTxnOffsetCommitRequestTopicPartition()
		op.Partition, op.Offset, op.LeaderEpoch = p, offset, -1
		ot.Partitions = append(ot.Partitions, op)
	}
	oc.Topics = append(oc.Topics, ot)
	ocResp, err := oc.RequestWith(ctx, cl)
	if err != nil {
		t.Fatalf("TxnOffsetCommit: %v", err)
	}
	for _, rt := range ocResp.Topics {
		for _, rp := range rt.Partitions {
			if err := kerr.ErrorForCode(rp.ErrorCode); err != nil {
				t.Fatalf("TxnOffsetCommit %s[%d]: %v", rt.Topic, rp.Partition, err)
			}
		}
	}
}

// Remove deletes the topics whose names are in topics or start with one of
// prefixes, and group (when not ""). A group that does not exist is not an
// error.
func (k *Kafka) Remove(ctx context.Context, group string, topics []string, prefixes ...string) error {
	// A client of its own: a client answers a metadata request from the
	// response it got less than MetadataMinAge ago, which would not list
	// the topics created since (a runner's dead-letter and retry topics).
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers...))
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	all, err := adm.ListTopics(ctx)
	if err != nil {
		return fmt.Errorf("listing topics: %w", err)
	}
	want := map[string]bool{}
	for _, tp := range topics {
		want[tp] = true
	}
	var del []string
	for tp := range all {
		if want[tp] {
			del = append(del, tp)
			continue
		}
		for _, p := range prefixes {
			if strings.HasPrefix(tp, p) {
				del = append(del, tp)
				break
			}
		}
	}
	var errs []error
	if len(del) > 0 {
		resps, err := adm.DeleteTopics(ctx, del...)
		if err == nil {
			err = resps.Error()
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("deleting topics %v: %w", del, err))
		}
	}
	if group != "" {
		if _, err := adm.DeleteGroup(ctx, group); err != nil && !isNoGroup(err) {
			errs = append(errs, fmt.Errorf("deleting group %s: %w", group, err))
		}
	}
	return errors.Join(errs...)
}

func isNoGroup(err error) bool {
	return kerr.IsRetriable(err) || errors.Is(err, kerr.GroupIDNotFound) || strings.Contains(err.Error(), kerr.GroupIDNotFound.Message)
}
