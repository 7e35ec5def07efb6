package consumer

import (
	"crypto/tls"
	"errors"
	"net"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// ErrBrokerSetup is wrapped by the error Run returns at start when the
// brokers refuse the client's security setup: SASL credentials or mechanism
// rejected, a TLS client against a plaintext listener, or a broker that
// hangs up on the first request (most often a TLS or SASL mismatch). The
// message says which setting to check; test for it with errors.Is. Every
// runner (consumer, dbscope, txn) returns it.
var ErrBrokerSetup = errors.New("kscope: the brokers refused the client's TLS or SASL setup")

// ErrBrokersUnreachable is wrapped by the error Run returns at start when
// no connection to any of Config.Brokers could be opened: the address or
// port is wrong, nothing listens there, the name does not resolve, or a
// firewall drops the connection. The message names the addresses and
// carries the dial error. Run returns it within the start bound of its
// first request, 20 seconds unless Config.ClientOptions set
// kgo.RetryTimeout (a refused port fails at once; an address that drops
// packets takes up to kgo.DialTimeout per attempt, 10 seconds by
// default, within that bound). Test for it with errors.Is. Every runner
// (consumer, dbscope, txn) returns it.
var ErrBrokersUnreachable = errors.New("kscope: the brokers could not be reached")

// startupRetryTimeout bounds the runner's first requests to the brokers
// (kgo.RetryTimeout), unless Config.ClientOptions set their own.
const startupRetryTimeout = 20 * time.Second

// unreachable reports whether err, from a request to the brokers, says
// that no TCP connection could be opened (refused, timed out, no route, a
// name that does not resolve), as opposed to a connection that opened and
// then failed (a TLS handshake, SASL, a hang-up).
func unreachable(err error) bool {
	if _, ok := errors.AsType[*net.DNSError](err); ok {
		return true
	}
	op, ok := errors.AsType[*net.OpError](err)
	return ok && op.Op == "dial"
}

// usesTLS reports whether cl dials its brokers over TLS. OptValue returns
// the configured *tls.Config as an interface, which is non-nil even when
// no TLS is configured (a typed nil), so the concrete value is checked.
func usesTLS(cl *kgo.Client) bool {
	c, _ := cl.OptValue(kgo.DialTLSConfig).(*tls.Config)
	return c != nil
}
