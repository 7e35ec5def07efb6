// Package dlreason says why a record goes to the dead-letter topic, as the
// bounded reason hook.Route.Reason carries (a label of
// kscope_dead_letters_total): the AtLeastOnce and DB scopes' routing
// (package consumer) and the Kafka scope's (package txn) both use it.
package dlreason

import (
	"errors"

	"github.com/kscope-dev/kscope/hook"
	"github.com/kscope-dev/kscope/internal/route"
	"github.com/kscope-dev/kscope/retrytopic"
)

// ErrExpired is consumer.ErrExpired: the error of a record older than
// consumer.Config.MaxAge.
var ErrExpired = errors.New("kscope: record expired (older than Config.MaxAge)")

// ErrDeliveriesExhausted is consumer.ErrDeliveriesExhausted: the error of
// a share group's record delivered more than ShareConfig.MaxDeliveries
// times.
var ErrDeliveriesExhausted = errors.New("kscope: share-group record delivered more times than Share.MaxDeliveries")

// Of returns why a record whose failure err, of class, sends it to the
// dead-letter topic goes there: one of the hook.Reason* constants.
func Of(err error, class retrytopic.Class) string {
	if d, ok := retrytopic.AsDecodeFailure(err); ok {
		if d.Incompatible {
			return hook.ReasonSchemaIncompatible
		}
		return hook.ReasonDeserializationFailure
	}
	switch {
	case errors.Is(err, ErrExpired):
		return hook.ReasonExpired
	case errors.Is(err, ErrDeliveriesExhausted):
		return hook.ReasonDeliveriesExhausted
	case errors.Is(err, route.ErrNoRoute):
		return hook.ReasonNoRoute
	case class == retrytopic.ClassTerminal:
		return hook.ReasonTerminalFailure
	}
	return hook.ReasonRetriesExhausted
}
