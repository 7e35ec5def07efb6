package route

import (
	"errors"
	"regexp"
	"strings"
	"testing"
)

func headers(kv ...string) Headers {
	return func(key string) ([]byte, bool) {
		for i := len(kv) - 2; i >= 0; i -= 2 {
			if kv[i] == key {
				return []byte(kv[i+1]), true
			}
		}
		return nil, false
	}
}

func TestLookupOrder(t *testing.T) {
	var tb Table[string]
	tb.Header("payments", "event-type", "refund", "refunds", false)
	tb.Topic("payments", "payments", false)
	tb.Topic("orders", "orders", false)
	tb.Pattern(`^audit\.`, "audit", false)
	cases := []struct {
		topic string
		hdr   Headers
		want  string
	}{
		{"orders", headers(), "orders"},
		{"payments", headers("event-type", "refund"), "refunds"},
		{"payments", headers("event-type", "refund", "event-type", "charge"), "payments"}, // the last header counts
		{"payments", headers(), "payments"},
		{"audit.eu", headers(), "audit"},
		{"g.kscope-retry-5s", headers(originalTopicHeader, "payments", "event-type", "refund"), "refunds"},
		{"g.kscope-retry-5s", headers(originalTopicHeader, "orders"), "orders"},
	}
	for _, c := range cases {
		got, err := tb.Lookup(c.topic, c.hdr)
		if err != nil || got != c.want {
			t.Errorf("Lookup(%q) = %q, %v; want %q", c.topic, got, err, c.want)
		}
	}
	// A source topic's record that carries an original-topic header is
	// routed by its own topic.
	if got, _ := tb.Lookup("orders", headers(originalTopicHeader, "payments")); got != "orders" {
		t.Errorf("a source record with an original-topic header went to %q", got)
	}
	if _, err := tb.Lookup("unknown", headers()); !errors.Is(err, ErrNoRoute) || !strings.Contains(err.Error(), `"unknown"`) {
		t.Errorf("no route: %v", err)
	}
	tb.Default("default", false)
	if got, err := tb.Lookup("unknown", headers()); err != nil || got != "default" {
		t.Errorf("default: %q, %v", got, err)
	}
}

func TestHeaderOnlyTopicNamesTheValue(t *testing.T) {
	var tb Table[string]
	tb.Header("payments", "event-type", "refund", "refunds", false)
	_, err := tb.Lookup("payments", headers("event-type", "chargeback"))
	if !errors.Is(err, ErrNoRoute) || !strings.Contains(err.Error(), `event-type="chargeback"`) {
		t.Fatalf("err = %v; want ErrNoRoute naming the header value", err)
	}
}

func TestCheck(t *testing.T) {
	var tb Table[string]
	tb.Topic("orders", "o", false)
	tb.Topic("orders", "o2", false)
	tb.Topic("ordres", "typo", false)
	tb.Pattern("(", "bad", false)
	tb.Pattern(`^audit\.`, "audit", false)
	tb.Header("payments", "", "x", "p", false)
	tb.Topic("x", "", true)
	var lines []string
	for _, p := range tb.Check("consumer.Router", []string{"orders", "shipments"}, []string{`^audit\.`, `^billing\.`}) {
		lines = append(lines, p.Field+": "+p.Reason)
	}
	got := strings.Join(lines, "\n")
	for _, want := range []string{
		`routed twice`, `Pattern("("): not a regular expression`, `header name is empty`, `handler is nil`,
		`Topics: lists "shipments"`, `TopicPatterns: has "^billing\\.", which the handler (a consumer.Router) has no Pattern route`,
		`routes topic "ordres", which Config.Topics does not list`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("Check's problems lack %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, `"orders", which`) {
		t.Errorf("a listed topic was reported:\n%s", got)
	}
}

func TestExclusions(t *testing.T) {
	keep := []string{"orders", "g.kscope-retry-5s", "g.kscope-retry-1m", "other.kscope-dlt"}
	var res []*regexp.Regexp
	for _, e := range Exclusions(keep, "custom-dlt", "orders") {
		res = append(res, regexp.MustCompile(e))
	}
	excluded := func(topic string) bool {
		for _, re := range res {
			if re.MatchString(topic) {
				return true
			}
		}
		return false
	}
	for _, k := range append(keep, "orders.eu", "g", "g.kscope", "kscope-retry-5s") {
		if excluded(k) {
			t.Errorf("%q is excluded; want it consumable", k)
		}
	}
	for _, x := range []string{"g.kscope-dlt", "g.kscope-retry-10m", "g.kscope-retry-5", "g.kscope-retry-5ss", "h.kscope-retry-5s",
		"gg.kscope-retry-5s", ".kscope-retry-5s", "xg.kscope-retry-5s", "g.kscope-versions.orders", "other.kscope-retry-5s",
		"other.kscope-dlt2", "a.b.kscope-dlt", "custom-dlt"} {
		if !excluded(x) {
			t.Errorf("%q is not excluded", x)
		}
	}
	if len(Exclusions(nil)) != 1 || !regexp.MustCompile(Exclusions(nil)[0]).MatchString("g.kscope-retry-5s") {
		t.Errorf("Exclusions(nil) = %q", Exclusions(nil))
	}
}
