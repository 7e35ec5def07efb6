package consumer

import "errors"

// ErrBrokerSetup is wrapped by the error Run returns at start when the
// brokers refuse the client's security setup: SASL credentials or mechanism
// rejected, a TLS client against a plaintext listener, or a broker that
// hangs up on the first request (most often a TLS or SASL mismatch). The
// message says which setting to check; test for it with errors.Is. Every
// runner (consumer, dbscope, txn) returns it.
var ErrBrokerSetup = errors.New("kscope: the brokers refused the client's TLS or SASL setup")
