package identity

import (
	"crypto/x509"
	"fmt"
	"log/slog"
	"time"

	"github.com/go-logr/logr"
	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
)

// ConditionType is the node condition that reports the client certificate's expiry.
const ConditionType v1.NodeConditionType = "HoldfastClientCertificateExpiring"

// Reasons of ConditionType.
const (
	ReasonValid    = "ClientCertificateValid"
	ReasonExpiring = "ClientCertificateExpiring"
	ReasonExpired  = "ClientCertificateExpired"
	ReasonNone     = "ClientCertificatePending"
)

// expiringWithin is how close to NotAfter the condition turns True: the last tenth of the
// lifetime, capped at 7 days. The certificate manager renews at 70-90% of the lifetime, so a
// certificate in its last tenth is one whose renewal is overdue (the apiserver unreachable,
// CSRs not approved); for a long certificate, a week left is overdue whatever the share.
func expiringWithin(lifetime time.Duration) time.Duration {
	return min(lifetime/10, 7*24*time.Hour)
}

// Condition is the node condition about the client certificate: False while it is valid and
// renewal is not overdue, True once it is within expiringWithin of its NotAfter or past it,
// Unknown while the first certificate is awaited. Only meaningful with a bootstrap kubeconfig.
func (id *Identity) Condition() v1.NodeCondition {
	return conditionFor(id.Current(), id.opts.Now())
}

func conditionFor(leaf *x509.Certificate, now time.Time) v1.NodeCondition {
	c := v1.NodeCondition{Type: ConditionType}
	if leaf == nil {
		c.Status, c.Reason, c.Message = v1.ConditionUnknown, ReasonNone, "waiting for the node client certificate (bootstrap CSR not approved or signed yet, or the apiserver unreachable)"
		return c
	}
	notBefore, notAfter := leaf.NotBefore, leaf.NotAfter
	left := notAfter.Sub(now)
	switch {
	case left <= 0:
		c.Status, c.Reason = v1.ConditionTrue, ReasonExpired
		c.Message = fmt.Sprintf("node client certificate expired at %s and was not renewed", notAfter.UTC().Format(time.RFC3339))
	case left <= expiringWithin(notAfter.Sub(notBefore)):
		c.Status, c.Reason = v1.ConditionTrue, ReasonExpiring
		c.Message = fmt.Sprintf("node client certificate expires at %s (in %s) and renewal has not succeeded yet", notAfter.UTC().Format(time.RFC3339), left.Round(time.Second))
	default:
		c.Status, c.Reason = v1.ConditionFalse, ReasonValid
		c.Message = fmt.Sprintf("node client certificate valid until %s", notAfter.UTC().Format(time.RFC3339))
	}
	return c
}

// klogFor hands client-go's certificate code our logger, one level quieter: it logs every
// load of the pair at Info.
func klogFor(log *slog.Logger) klog.Logger {
	return logr.FromSlogHandler(log.Handler()).V(1)
}
