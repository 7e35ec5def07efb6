package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// A node's configuration, JVM options and storage.

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
	}
	props = append(append(append(props, smallMachineProps...), shareGroupProps...), consumerGroupProps...)
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

// jvmArgs are the JVM options of every process the backend starts: the
// cluster's own (the class archive, apache_cds.go), a small heap, a fast
// start, and logs to the node's server.log. The JVM's
// temporary files (the native library snappy-java unpacks, 280 KB a
// start) go to the node's directory, which Close removes, rather than to
// the system's, where a killed broker left them; and no performance-data
// file is written to /tmp/hsperfdata_<user>.
func (c *ApacheCluster) jvmArgs(nd *apacheNode) []string {
	return append(slices.Clip(c.jvmOpts),
		"-Xms128m", "-Xmx768m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xss1m",
		"-XX:-UsePerfData", "-Djava.io.tmpdir="+nd.dir,
		"-Djava.awt.headless=true",
		"-Dlog4j2.configurationFile="+filepath.Join(nd.dir, "log4j2.properties"),
		"-cp", c.classpath,
	)
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

// storageTemplate is what kafka-storage format writes into a node's data
// directory for the default configuration, meta.properties aside: the
// release's bootstrap records (a bootstrap.checkpoint, or in Apache Kafka
// 4.4 the metadata log's first snapshot), the same for every cluster and
// node but for their timestamps. It is written once per process, by
// formatting a template node; each node's storage is then a copy of it and
// a meta.properties of its own, without a JVM run of the tool per node
// (0.7 s of a core each on a 2-core test machine).
var storageTemplate struct {
	once  sync.Once
	files []templateFile
	err   error
}

// templateFile is one file of storageTemplate: its path under the data
// directory, its permissions and its contents.
type templateFile struct {
	path string
	mode fs.FileMode
	data []byte
}

// formatFromTemplate writes what kafka-storage format writes for nd with
// the default configuration: the template's files, and a meta.properties
// naming the cluster, the node and a new directory id.
func (c *ApacheCluster) formatFromTemplate(ctx context.Context, nd *apacheNode, clusterID string) error {
	storageTemplate.once.Do(func() {
		storageTemplate.files, storageTemplate.err = c.formatTemplate(ctx)
	})
	if storageTemplate.err != nil {
		return fmt.Errorf("testenv: formatting a template node of Apache Kafka: %w", storageTemplate.err)
	}
	data := filepath.Join(nd.dir, "data")
	for _, f := range storageTemplate.files {
		p := filepath.Join(data, f.path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, f.data, f.mode); err != nil {
			return err
		}
	}
	meta := fmt.Sprintf("#\n#written by kscope's testenv, as kafka-storage format does\nnode.id=%d\ndirectory.id=%s\nversion=1\ncluster.id=%s\n", nd.id, kafkaUUID(), clusterID)
	return os.WriteFile(filepath.Join(data, "meta.properties"), []byte(meta), 0o644)
}

// formatTemplate formats a template node with kafka-storage format and
// returns the files it wrote, meta.properties aside. It fails when the
// format wrote nothing else: a node would start without the release's
// bootstrap records.
func (c *ApacheCluster) formatTemplate(ctx context.Context) ([]templateFile, error) {
	dir, err := os.MkdirTemp("", "kscope-kafka-format-*")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	tc := &ApacheCluster{classpath: c.classpath, java: c.java}
	tn := &apacheNode{id: 1, port: 1, controller: 2, dir: dir}
	tc.nodes = []*apacheNode{tn}
	if err := tc.writeConfig(tn, nil); err != nil {
		return nil, err
	}
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	if err := tc.format(fctx, tn, kafkaUUID()); err != nil {
		return nil, err
	}
	data := filepath.Join(dir, "data")
	var files []templateFile
	err = filepath.WalkDir(data, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() == "meta.properties" {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(data, p)
		if err != nil {
			return err
		}
		files = append(files, templateFile{path: rel, mode: info.Mode().Perm(), data: b})
		return nil
	})
	if err == nil && len(files) == 0 {
		err = errors.New("kafka-storage format wrote no bootstrap records besides meta.properties")
	}
	return files, err
}

// shareGroupProps are a test broker's share-group settings: members join
// within half a second, and a test may shorten a group's acquisition locks
// to a second (share.record.lock.duration.ms, consumer.ShareConfig.LockDuration).
var shareGroupProps = [][2]string{
	{"group.share.min.heartbeat.interval.ms", "100"},
	{"group.share.heartbeat.interval.ms", "500"},
	{"group.share.min.record.lock.duration.ms", "1000"},
}

// smallMachineProps size a test broker for a small shared machine.
var smallMachineProps = [][2]string{
	{"num.network.threads", "2"},
	{"num.io.threads", "4"},
	{"num.recovery.threads.per.data.dir", "1"},
	{"background.threads", "4"},
	{"log.cleaner.threads", "1"},
	{"log.cleaner.dedupe.buffer.size", strconv.Itoa(4 << 20)},
}

// consumerGroupProps are the settings of the consumer group protocol
// (KIP-848) on a test broker. Its members reconcile an assignment change at
// their next heartbeat: every 500 ms rather than the default 5 s, as the
// classic members the suites configure; a fenced or killed member's
// partitions move after 6 s (the default session is 45 s).
var consumerGroupProps = [][2]string{
	{"group.consumer.min.heartbeat.interval.ms", "100"},
	{"group.consumer.heartbeat.interval.ms", "500"},
	{"group.consumer.min.session.timeout.ms", "1000"},
	{"group.consumer.session.timeout.ms", "6000"},
}
