package testenv

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// ApacheKafkaVersion is the Apache Kafka release the "apache" backend runs:
// the broker artifact org.apache.kafka:kafka_2.13 at this version, with its
// runtime dependencies, resolved from Maven Central. It is pinned here and
// nowhere else.
const ApacheKafkaVersion = "4.4.0"

// log4jVersion is the Log4j 2 release that the broker logs through (its
// distribution ships Log4j 2; the Maven artifact leaves the backend to the
// application).
const log4jVersion = "2.24.3"

// ApacheOptions shape an Apache Kafka cluster started by [StartApacheKafka].
type ApacheOptions struct {
	// Nodes is the number of KRaft nodes, each both broker and controller
	// (combined mode). 0 means 1. With 3 or more nodes topics are
	// replicated 3 ways with min.insync.replicas=2, so one broker can be
	// killed without losing acknowledged writes or availability.
	Nodes int
	// Settings are extra server.properties entries (name → value), applied
	// to every node after the defaults.
	Settings map[string]string
	// Port is the first node's broker port; 0 picks a free one. The other
	// listeners always take free ports.
	Port int
}

// ApacheCluster is a running Apache Kafka cluster of one or more KRaft nodes
// on loopback ports, each a JVM this process started. Its processes are
// stopped by Close; on Linux they are also killed if this process dies.
type ApacheCluster struct {
	// Version is the Apache Kafka release it runs.
	Version string
	// Dir is the cluster's temporary directory: per node a server.properties,
	// a data directory and server.log. It is removed by Close.
	Dir string

	classpath string
	java      string
	jvmOpts   []string // before the backend's own (the class archive)
	nodes     []*apacheNode
	adm       *kgo.Client
	mu        sync.Mutex
	closed    bool
}

// apacheNode is one KRaft node: broker and controller in one JVM.
type apacheNode struct {
	id         int32
	port       int // broker listener
	controller int // controller listener
	dir        string
	cmd        *exec.Cmd
	exited     chan struct{}
}

// Addr is the node's broker listener.
func (n *apacheNode) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(n.port)) }

// ErrNoJava says that the Apache Kafka backend cannot run here, and how to
// make it run.
var ErrNoJava = errors.New("testenv: the Apache Kafka backend needs a JDK (17 or newer) and Maven on PATH " +
	"(Debian: apt-get install default-jdk-headless maven), or unset KSCOPE_KAFKA to use the in-process kfake cluster")

// StartApacheKafka starts an Apache Kafka cluster ([ApacheKafkaVersion]) from
// its Maven Central artifacts and returns it as a Kafka backend of kind
// "apache", whose Apache field controls the cluster. The artifacts are
// resolved with Maven once into the cache directory (KSCOPE_KAFKA_CACHE, by
// default kscope/kafka-<version> under the user's cache directory); later
// starts use the cache and take seconds. Close stops every process started.
func StartApacheKafka(ctx context.Context, o ApacheOptions) (*Kafka, error) {
	c, err := startApache(ctx, o)
	if err != nil {
		return nil, err
	}
	k, err := newKafka(c.Brokers(), nil, "apache", c.Close)
	if err != nil {
		return nil, err
	}
	k.Apache = c
	return k, nil
}

func startApache(ctx context.Context, o ApacheOptions) (*ApacheCluster, error) {
	java, err := javaPath()
	if err != nil {
		return nil, err
	}
	cp, err := ApacheKafkaClasspath(ctx)
	if err != nil {
		return nil, err
	}
	var jvmOpts []string
	if a := sharedArchive(ctx, java, cp); a != "" {
		jvmOpts = []string{"-XX:SharedArchiveFile=" + a}
	}
	n := max(o.Nodes, 1)
	// A port found free can be taken by someone else before the JVM binds
	// it; a start that fails that way is tried again on new ports.
	var lastErr error
	for range 3 {
		c, err := tryStartApache(ctx, java, cp, n, o, jvmOpts)
		if err == nil {
			return c, nil
		}
		lastErr = err
		if ctx.Err() != nil || o.Port != 0 || !strings.Contains(err.Error(), "Address already in use") {
			break
		}
	}
	return nil, lastErr
}

// tryStartApache starts a cluster of n nodes whose JVMs take jvmOpts
// besides the backend's own options.
func tryStartApache(ctx context.Context, java, cp string, n int, o ApacheOptions, jvmOpts []string) (*ApacheCluster, error) {
	dir, err := os.MkdirTemp("", "kscope-kafka-*")
	if err != nil {
		return nil, err
	}
	c := &ApacheCluster{Version: ApacheKafkaVersion, Dir: dir, classpath: cp, java: java, jvmOpts: jvmOpts}
	ports, err := freePorts(2 * n)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if o.Port != 0 {
		ports[0] = o.Port
	}
	for i := range n {
		nd := &apacheNode{id: int32(i + 1), port: ports[2*i], controller: ports[2*i+1], dir: filepath.Join(dir, fmt.Sprintf("node-%d", i+1))}
		c.nodes = append(c.nodes, nd)
	}
	clusterID := kafkaUUID()
	formatErrs := make(chan error, n)
	for _, nd := range c.nodes {
		if err := os.MkdirAll(nd.dir, 0o755); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		if err := c.writeConfig(nd, o.Settings); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		if len(o.Settings) == 0 {
			// The storage of a node as kafka-storage format writes it,
			// without a JVM run per node (a second of CPU each).
			go func() { formatErrs <- c.formatFromTemplate(ctx, nd, clusterID) }()
			continue
		}
		go func() { formatErrs <- c.format(ctx, nd, clusterID) }()
	}
	var ferr error
	for range n {
		ferr = errors.Join(ferr, <-formatErrs)
	}
	if ferr != nil {
		os.RemoveAll(dir)
		return nil, ferr
	}
	for _, nd := range c.nodes {
		if err := c.startNode(nd); err != nil {
			c.Close()
			return nil, err
		}
	}
	c.adm, err = kgo.NewClient(kgo.SeedBrokers(c.Brokers()...))
	if err != nil {
		c.Close()
		return nil, err
	}
	if err := c.waitBrokers(ctx, c.NodeIDs(), 2*time.Minute); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// Brokers returns every node's broker listener.
func (c *ApacheCluster) Brokers() []string {
	out := make([]string, len(c.nodes))
	for i, nd := range c.nodes {
		out[i] = nd.Addr()
	}
	return out
}

// NodeIDs returns the cluster's node ids (1..n).
func (c *ApacheCluster) NodeIDs() []int32 {
	out := make([]int32, len(c.nodes))
	for i, nd := range c.nodes {
		out[i] = nd.id
	}
	return out
}

func (c *ApacheCluster) node(id int32) (*apacheNode, error) {
	for _, nd := range c.nodes {
		if nd.id == id {
			return nd, nil
		}
	}
	return nil, fmt.Errorf("testenv: the cluster has no node %d (it has %v)", id, c.NodeIDs())
}

// Kill sends SIGKILL to node id's JVM and waits until it is gone. Its data
// directory stays, so Restart brings the same broker back.
func (c *ApacheCluster) Kill(id int32) error {
	nd, err := c.node(id)
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if nd.cmd == nil {
		return fmt.Errorf("testenv: node %d is not running", id)
	}
	killGroup(nd.cmd)
	<-nd.exited
	nd.cmd = nil
	return nil
}

// Restart starts node id again after Kill, on the same ports and data
// directory, and waits (bounded by ctx and two minutes) until it is back in
// the cluster's metadata as a live broker.
func (c *ApacheCluster) Restart(ctx context.Context, id int32) error {
	nd, err := c.node(id)
	if err != nil {
		return err
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return errors.New("testenv: the cluster is closed")
	}
	if nd.cmd != nil {
		c.mu.Unlock()
		return fmt.Errorf("testenv: node %d is running; Kill it first", id)
	}
	err = c.startNodeLocked(nd)
	c.mu.Unlock()
	if err != nil {
		return err
	}
	return c.waitBrokers(ctx, []int32{id}, 2*time.Minute)
}

// Running reports whether node id's JVM is running (started and not
// killed, and it has not exited on its own).
func (c *ApacheCluster) Running(id int32) bool {
	nd, err := c.node(id)
	if err != nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if nd.cmd == nil {
		return false
	}
	select {
	case <-nd.exited:
		return false
	default:
		return true
	}
}

// Leader returns the node id leading topic's partition (-1 while it has no
// leader).
func (c *ApacheCluster) Leader(ctx context.Context, topic string, partition int32) (int32, error) {
	td, err := topicMetadata(ctx, c.adm, topic)
	if err != nil {
		return -1, err
	}
	for _, p := range td.Partitions {
		if p.Partition == partition {
			return p.Leader, nil
		}
	}
	return -1, fmt.Errorf("testenv: topic %s has no partition %d", topic, partition)
}

// GroupCoordinator returns the node id of group's coordinator. While the
// coordinator is not available yet (the offsets topic is created on first
// use, or its partition is moving after a broker died) it asks again, for up
// to 30 s.
func (c *ApacheCluster) GroupCoordinator(ctx context.Context, group string) (int32, error) {
	return c.coordinator(ctx, "group "+group, func(ctx context.Context) kadm.FindCoordinatorResponse {
		return kadm.NewClient(c.adm).FindGroupCoordinators(ctx, group)[group]
	})
}

// TxnCoordinator returns the node id of the transaction coordinator of
// transactional id txnID, asking again as GroupCoordinator does.
func (c *ApacheCluster) TxnCoordinator(ctx context.Context, txnID string) (int32, error) {
	return c.coordinator(ctx, "transactional id "+txnID, func(ctx context.Context) kadm.FindCoordinatorResponse {
		return kadm.NewClient(c.adm).FindTxnCoordinators(ctx, txnID)[txnID]
	})
}

func (c *ApacheCluster) coordinator(ctx context.Context, what string, find func(context.Context) kadm.FindCoordinatorResponse) (int32, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		r := find(ctx)
		if r.Err == nil {
			return r.NodeID, nil
		}
		if !kerr.IsRetriable(r.Err) {
			return -1, fmt.Errorf("testenv: finding the coordinator of %s: %w", what, r.Err)
		}
		select {
		case <-ctx.Done():
			return -1, fmt.Errorf("testenv: finding the coordinator of %s: %w (still after %v)", what, r.Err, ctx.Err())
		case <-time.After(100 * time.Millisecond): // the next request
		}
	}
}

// LogTail returns the last lines of node id's server.log, for a test's
// failure message.
func (c *ApacheCluster) LogTail(id int32, lines int) string {
	nd, err := c.node(id)
	if err != nil {
		return err.Error()
	}
	out := tailFile(filepath.Join(nd.dir, "server.log"), lines)
	if std := tailFile(filepath.Join(nd.dir, "stdout.log"), lines); std != "" {
		out += "\n(stdout and stderr)\n" + std
	}
	return out
}

// Close kills every node and removes the cluster's directory. It is
// idempotent.
func (c *ApacheCluster) Close() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	for _, nd := range c.nodes {
		if nd.cmd != nil {
			killGroup(nd.cmd)
			<-nd.exited
			nd.cmd = nil
		}
	}
	c.mu.Unlock()
	if c.adm != nil {
		c.adm.Close()
	}
	os.RemoveAll(c.Dir)
}

// waitBrokers waits until every node in ids is a live broker in the
// metadata, failing early when one of their JVMs exits.
func (c *ApacheCluster) waitBrokers(ctx context.Context, ids []int32, d time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	adm := kadm.NewClient(c.adm)
	for {
		for _, id := range ids {
			if !c.Running(id) {
				return fmt.Errorf("testenv: Apache Kafka node %d exited while starting; its log ends:\n%s", id, c.LogTail(id, 30))
			}
		}
		rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
		bs, err := adm.ListBrokers(rctx)
		rcancel()
		if err == nil {
			live := bs.NodeIDs()
			if !slices.ContainsFunc(ids, func(id int32) bool { return !slices.Contains(live, id) }) {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("testenv: Apache Kafka nodes %v did not answer as brokers within %s (last error: %v); node %d's log ends:\n%s",
				ids, d, err, ids[0], c.LogTail(ids[0], 30))
		case <-time.After(100 * time.Millisecond): // the next metadata request
		}
	}
}

func (c *ApacheCluster) startNode(nd *apacheNode) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.startNodeLocked(nd)
}

func (c *ApacheCluster) startNodeLocked(nd *apacheNode) error {
	out, err := os.OpenFile(filepath.Join(nd.dir, "stdout.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	args := append(c.jvmArgs(nd), "kafka.Kafka", filepath.Join(nd.dir, "server.properties"))
	cmd := exec.Command(c.java, args...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = childProcAttr()
	if err := cmd.Start(); err != nil {
		out.Close()
		return fmt.Errorf("testenv: starting Apache Kafka node %d: %w", nd.id, err)
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		out.Close()
		close(exited)
	}()
	nd.cmd, nd.exited = cmd, exited
	return nil
}

// killGroup sends SIGKILL to cmd's process group (the JVM and anything it
// started).
func killGroup(cmd *exec.Cmd) {
	if cmd.Process == nil {
		return
	}
	if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); err != nil {
		cmd.Process.Kill()
	}
}

// freePorts returns n distinct loopback ports that were free when asked.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	out := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("testenv: finding a free loopback port: %w", err)
		}
		ls = append(ls, l)
		out = append(out, l.Addr().(*net.TCPAddr).Port)
	}
	return out, nil
}

// kafkaUUID returns a random Kafka UUID (16 bytes, URL-safe base64 without
// padding), the form of a KRaft cluster id. Like Kafka's Uuid.randomUuid it
// never starts with '-', which the storage tool would take for an option.
func kafkaUUID() string {
	for {
		var b [16]byte
		rand.Read(b[:])
		if s := base64.RawURLEncoding.EncodeToString(b[:]); s[0] != '-' {
			return s
		}
	}
}

// javaPath returns JAVA_HOME's java, or else the one on PATH.
func javaPath() (string, error) {
	if jh := os.Getenv("JAVA_HOME"); jh != "" {
		if p := filepath.Join(jh, "bin", "java"); fileExists(p) {
			return p, nil
		}
	}
	java, err := exec.LookPath("java")
	if err != nil {
		return "", ErrNoJava
	}
	return java, nil
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// tailFile returns the last lines of the file at path.
func tailFile(path string, lines int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	if len(b) == 0 {
		return ""
	}
	ls := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(ls) > lines {
		ls = ls[len(ls)-lines:]
	}
	return strings.Join(ls, "\n")
}
