package testenv

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
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
const ApacheKafkaVersion = "4.3.1"

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
	java, err := exec.LookPath("java")
	if jh := os.Getenv("JAVA_HOME"); jh != "" {
		if p := filepath.Join(jh, "bin", "java"); fileExists(p) {
			java, err = p, nil
		}
	}
	if err != nil {
		return nil, ErrNoJava
	}
	cp, err := ApacheKafkaClasspath(ctx)
	if err != nil {
		return nil, err
	}
	n := max(o.Nodes, 1)
	// A port found free can be taken by someone else before the JVM binds
	// it; a start that fails that way is tried again on new ports.
	var lastErr error
	for range 3 {
		c, err := tryStartApache(ctx, java, cp, n, o)
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

func tryStartApache(ctx context.Context, java, cp string, n int, o ApacheOptions) (*ApacheCluster, error) {
	dir, err := os.MkdirTemp("", "kscope-kafka-*")
	if err != nil {
		return nil, err
	}
	c := &ApacheCluster{Version: ApacheKafkaVersion, Dir: dir, classpath: cp, java: java}
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
	md, err := kadm.NewClient(c.adm).Metadata(ctx, topic)
	if err != nil {
		return -1, err
	}
	td, ok := md.Topics[topic]
	if !ok {
		return -1, fmt.Errorf("testenv: topic %s is not in the metadata", topic)
	}
	if td.Err != nil {
		return -1, td.Err
	}
	pd, ok := td.Partitions[partition]
	if !ok {
		return -1, fmt.Errorf("testenv: topic %s has no partition %d", topic, partition)
	}
	return pd.Leader, nil
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

// writeConfig writes nd's server.properties and its log4j2 configuration.
func (c *ApacheCluster) writeConfig(nd *apacheNode, settings map[string]string) error {
	n := len(c.nodes)
	rf, minISR := 1, 1
	if n >= 3 {
		rf, minISR = 3, 2
	}
	var voters []string
	for _, o := range c.nodes {
		voters = append(voters, fmt.Sprintf("%d@127.0.0.1:%d", o.id, o.controller))
	}
	props := [][2]string{
		{"process.roles", "broker,controller"},
		{"node.id", strconv.Itoa(int(nd.id))},
		{"controller.quorum.voters", strings.Join(voters, ",")},
		{"listeners", fmt.Sprintf("PLAINTEXT://127.0.0.1:%d,CONTROLLER://127.0.0.1:%d", nd.port, nd.controller)},
		{"advertised.listeners", fmt.Sprintf("PLAINTEXT://127.0.0.1:%d", nd.port)},
		{"controller.listener.names", "CONTROLLER"},
		{"inter.broker.listener.name", "PLAINTEXT"},
		{"listener.security.protocol.map", "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"},
		{"log.dirs", filepath.Join(nd.dir, "data")},
		// As on kfake: topics exist only when created, with one partition
		// unless asked otherwise.
		{"auto.create.topics.enable", "false"},
		{"num.partitions", "1"},
		{"default.replication.factor", strconv.Itoa(rf)},
		{"min.insync.replicas", strconv.Itoa(minISR)},
		{"offsets.topic.replication.factor", strconv.Itoa(rf)},
		{"offsets.topic.num.partitions", "6"},
		{"transaction.state.log.replication.factor", strconv.Itoa(rf)},
		{"transaction.state.log.min.isr", strconv.Itoa(minISR)},
		{"transaction.state.log.num.partitions", "6"},
		{"share.coordinator.state.topic.replication.factor", strconv.Itoa(rf)},
		{"share.coordinator.state.topic.min.isr", strconv.Itoa(minISR)},
		{"unclean.leader.election.enable", "false"},
		// A test broker: groups form at once, and members may ask for the
		// short session timeouts the suites use to expire a killed
		// consumer quickly (the broker default minimum is 6 s).
		{"group.initial.rebalance.delay.ms", "0"},
		{"group.min.session.timeout.ms", "100"},
		// A killed broker is fenced, and its partitions led elsewhere,
		// after 3 s without a heartbeat (the default is 9 s).
		{"broker.heartbeat.interval.ms", "500"},
		{"broker.session.timeout.ms", "3000"},
		// Sized for a small shared machine.
		{"num.network.threads", "2"},
		{"num.io.threads", "4"},
		{"num.recovery.threads.per.data.dir", "1"},
		{"background.threads", "4"},
		{"log.cleaner.threads", "1"},
		{"log.cleaner.dedupe.buffer.size", strconv.Itoa(4 << 20)},
	}
	keys := make([]string, 0, len(settings))
	for k := range settings {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		props = append(props, [2]string{k, settings[k]})
	}
	var b bytes.Buffer
	for _, p := range props {
		fmt.Fprintf(&b, "%s=%s\n", p[0], p[1])
	}
	if err := os.WriteFile(filepath.Join(nd.dir, "server.properties"), b.Bytes(), 0o644); err != nil {
		return err
	}
	log4j := "status = error\n" +
		"appender.file.type = File\n" +
		"appender.file.name = file\n" +
		"appender.file.fileName = " + filepath.Join(nd.dir, "server.log") + "\n" +
		"appender.file.layout.type = PatternLayout\n" +
		"appender.file.layout.pattern = [%d] %p %m (%c)%n\n" +
		"rootLogger.level = INFO\n" +
		"rootLogger.appenderRef.file.ref = file\n" +
		// The per-request and state-change loggers are too chatty for a
		// test log.
		"logger.state.name = state.change.logger\n" +
		"logger.state.level = WARN\n"
	return os.WriteFile(filepath.Join(nd.dir, "log4j2.properties"), []byte(log4j), 0o644)
}

// jvmArgs are the JVM options of every process the backend starts: a small
// heap, a fast start, and logs to the node's server.log. The JVM's
// temporary files (the native library snappy-java unpacks, 280 KB a
// start) go to the node's directory, which Close removes, rather than to
// the system's, where a killed broker left them; and no performance-data
// file is written to /tmp/hsperfdata_<user>.
func (c *ApacheCluster) jvmArgs(nd *apacheNode) []string {
	return []string{
		"-Xms128m", "-Xmx768m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xss1m",
		"-XX:-UsePerfData", "-Djava.io.tmpdir=" + nd.dir,
		"-Djava.awt.headless=true",
		"-Dlog4j2.configurationFile=" + filepath.Join(nd.dir, "log4j2.properties"),
		"-cp", c.classpath,
	}
}

// format is `kafka-storage.sh format`: it writes the node's meta.properties
// and bootstrap metadata for the cluster id.
func (c *ApacheCluster) format(ctx context.Context, nd *apacheNode, clusterID string) error {
	args := append(c.jvmArgs(nd), "kafka.tools.StorageTool", "format", "-t", clusterID,
		"-c", filepath.Join(nd.dir, "server.properties"), "--ignore-formatted")
	cmd := exec.CommandContext(ctx, c.java, args...)
	cmd.SysProcAttr = childProcAttr()
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("testenv: formatting Apache Kafka node %d's storage: %v\n%s", nd.id, err, out)
	}
	return nil
}

// storageTemplate is the bootstrap.checkpoint that kafka-storage format
// writes into a node's data directory for the default configuration: the
// feature levels of the release, the same for every cluster and node. It
// is written once per process, by formatting a template node. A release
// whose format writes no bootstrap.checkpoint (Apache Kafka 4.4 writes its
// bootstrap records into the metadata log's first snapshot instead) has
// none: each node is then formatted by the tool.
var storageTemplate struct {
	once       sync.Once
	checkpoint []byte
	none       bool // the release's format writes no bootstrap.checkpoint
	err        error
}

// formatFromTemplate writes what kafka-storage format writes for nd with
// the default configuration: the release's bootstrap.checkpoint, and a
// meta.properties naming the cluster, the node and a new directory id.
func (c *ApacheCluster) formatFromTemplate(ctx context.Context, nd *apacheNode, clusterID string) error {
	storageTemplate.once.Do(func() {
		dir, err := os.MkdirTemp("", "kscope-kafka-format-*")
		if err != nil {
			storageTemplate.err = err
			return
		}
		defer os.RemoveAll(dir)
		tc := &ApacheCluster{classpath: c.classpath, java: c.java}
		tn := &apacheNode{id: 1, port: 1, controller: 2, dir: dir}
		tc.nodes = []*apacheNode{tn}
		if err := tc.writeConfig(tn, nil); err != nil {
			storageTemplate.err = err
			return
		}
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		defer cancel()
		if err := tc.format(fctx, tn, kafkaUUID()); err != nil {
			storageTemplate.err = err
			return
		}
		storageTemplate.checkpoint, storageTemplate.err = os.ReadFile(filepath.Join(dir, "data", "bootstrap.checkpoint"))
		if errors.Is(storageTemplate.err, fs.ErrNotExist) {
			storageTemplate.none, storageTemplate.err = true, nil
		}
	})
	if storageTemplate.err != nil {
		return fmt.Errorf("testenv: formatting a template node of Apache Kafka: %w", storageTemplate.err)
	}
	if storageTemplate.none {
		return c.format(ctx, nd, clusterID)
	}
	data := filepath.Join(nd.dir, "data")
	if err := os.MkdirAll(data, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(data, "bootstrap.checkpoint"), storageTemplate.checkpoint, 0o644); err != nil {
		return err
	}
	meta := fmt.Sprintf("#\n#written by kscope's testenv, as kafka-storage format does\nnode.id=%d\ndirectory.id=%s\nversion=1\ncluster.id=%s\n", nd.id, kafkaUUID(), clusterID)
	return os.WriteFile(filepath.Join(data, "meta.properties"), []byte(meta), 0o644)
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

// ApacheKafkaClasspath returns the Java classpath of the Apache Kafka broker
// ([ApacheKafkaVersion]) and its runtime dependencies, resolving them with
// Maven into the cache directory the first time. Concurrent callers, also
// in other processes, wait for one resolution.
func ApacheKafkaClasspath(ctx context.Context) (string, error) {
	dir, err := apacheCacheDir()
	if err != nil {
		return "", err
	}
	pom := apachePOM()
	sum := sha256.Sum256([]byte(pom))
	stamp := hex.EncodeToString(sum[:8])
	lib := filepath.Join(dir, "lib")
	done := filepath.Join(dir, "resolved")
	if b, err := os.ReadFile(done); err == nil && strings.TrimSpace(string(b)) == stamp {
		return filepath.Join(lib, "*"), nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("testenv: creating the Apache Kafka cache %s: %w", dir, err)
	}
	unlock, err := lockFile(ctx, filepath.Join(dir, "lock"))
	if err != nil {
		return "", err
	}
	defer unlock()
	if b, err := os.ReadFile(done); err == nil && strings.TrimSpace(string(b)) == stamp {
		return filepath.Join(lib, "*"), nil // another process resolved it meanwhile
	}
	mvn, err := exec.LookPath("mvn")
	if err != nil {
		return "", ErrNoJava
	}
	if err := os.WriteFile(filepath.Join(dir, "pom.xml"), []byte(pom), 0o644); err != nil {
		return "", err
	}
	tmp := filepath.Join(dir, "lib.partial")
	os.RemoveAll(tmp)
	cmd := exec.CommandContext(ctx, mvn, "-q", "-B", "-f", filepath.Join(dir, "pom.xml"),
		"dependency:copy-dependencies", "-DincludeScope=runtime", "-DoutputDirectory="+tmp)
	cmd.SysProcAttr = childProcAttr()
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("testenv: resolving Apache Kafka %s from Maven Central with %s: %v\n%s", ApacheKafkaVersion, mvn, err, out)
	}
	os.RemoveAll(lib)
	if err := os.Rename(tmp, lib); err != nil {
		return "", err
	}
	if err := os.WriteFile(done, []byte(stamp+"\n"), 0o644); err != nil {
		return "", err
	}
	return filepath.Join(lib, "*"), nil
}

// apacheCacheDir is KSCOPE_KAFKA_CACHE, or kscope/kafka-<version> under the
// user's cache directory.
func apacheCacheDir() (string, error) {
	if d := os.Getenv("KSCOPE_KAFKA_CACHE"); d != "" {
		return d, nil
	}
	base, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("testenv: no cache directory for the Apache Kafka artifacts (%v); set KSCOPE_KAFKA_CACHE", err)
	}
	return filepath.Join(base, "kscope", "kafka-"+ApacheKafkaVersion), nil
}

// apachePOM is the Maven project whose runtime dependencies are the broker's
// classpath: the broker and the Log4j 2 backend its distribution logs with.
func apachePOM() string {
	dep := func(g, a, v string) string {
		return "    <dependency><groupId>" + g + "</groupId><artifactId>" + a + "</artifactId><version>" + v + "</version></dependency>\n"
	}
	return `<?xml version="1.0" encoding="UTF-8"?>
<!-- Generated by kscope's internal/testenv: the Apache Kafka broker's runtime classpath. -->
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>dev.kscope.testenv</groupId>
  <artifactId>apache-kafka-runtime</artifactId>
  <version>` + ApacheKafkaVersion + `</version>
  <packaging>pom</packaging>
  <dependencies>
` + dep("org.apache.kafka", "kafka_2.13", ApacheKafkaVersion) +
		dep("org.apache.logging.log4j", "log4j-core", log4jVersion) +
		dep("org.apache.logging.log4j", "log4j-slf4j-impl", log4jVersion) + `  </dependencies>
</project>
`
}

// lockFile takes an exclusive lock on path, waiting for it as long as ctx
// allows, and returns its release.
func lockFile(ctx context.Context, path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { syscall.Flock(int(f.Fd()), syscall.LOCK_UN); f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("testenv: locking %s: %w", path, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("testenv: waiting for another process resolving the Apache Kafka artifacts (%s): %w", path, ctx.Err())
		case <-time.After(200 * time.Millisecond): // the next try of the lock
		}
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
