package volumes

import (
	"context"
	"fmt"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/holdfast-dev/holdfast/offline"
)

// maxTokenAge is the age at which a token is renewed whatever its lifetime (kubelet's 24 h).
const maxTokenAge = 24 * time.Hour

type tokenKey struct {
	uid            types.UID
	serviceAccount string
	audience       string
	expiration     int64
}

// name is the key's name in the Cache, unique within the pod.
func (k tokenKey) name() string {
	return fmt.Sprintf("%s/%d/%s", k.serviceAccount, k.expiration, k.audience)
}

type cachedToken struct {
	token     string
	renewAt   time.Time // 80% of the requested lifetime, at most maxTokenAge
	expiresAt time.Time
	// restored: read back from the Cache after a restart. It is renewed at the first chance,
	// and while the apiserver is out of reach it is mounted even past its expiry: the pod runs,
	// and only its own calls to the apiserver fail until the agent reconnects.
	restored bool
}

// restoreToken returns the token the Cache kept for key, as due for renewal.
func (m *Manager) restoreToken(key tokenKey, now time.Time) (cachedToken, bool) {
	if m.opts.Cache == nil || !m.opts.PersistSecrets {
		return cachedToken{}, false
	}
	t, err := m.opts.Cache.GetToken(key.uid, key.name())
	if err != nil {
		m.reportUnreadableCopy("service account token "+key.name()+" of pod "+string(key.uid), err)
		return cachedToken{}, false
	}
	return cachedToken{token: t.Token, renewAt: now, expiresAt: t.ExpiresAt, restored: true}, true
}

// usable says whether a token may still be mounted when renewing it failed with err.
func (t cachedToken) usable(now time.Time, err error) bool {
	return now.Before(t.expiresAt) || (t.restored && unreachable(err))
}

// keepToken writes a fetched token to the Cache (sealed by it), so that the pod gets it again
// after a reboot with no apiserver.
func (m *Manager) keepToken(key tokenKey, t cachedToken, issuedAt time.Time) {
	if m.opts.Cache == nil || !m.opts.PersistSecrets {
		return
	}
	err := m.opts.Cache.PutToken(key.uid, key.name(), offline.Token{Token: t.token, IssuedAt: issuedAt, ExpiresAt: t.expiresAt})
	if err != nil {
		m.log.Warn("keep the service account token for offline use", "pod", string(key.uid), "token", key.name(), "err", err)
	}
}

// serviceAccountToken returns a token for pod's service account bound to the pod, requested
// with the node's identity through the TokenRequest API (the Node authorizer allows it for pods
// bound to this node, NodeRestriction checks the binding). Tokens are reused until 80% of their
// lifetime; a renewal that fails keeps the current token while it is valid.
func (m *Manager) serviceAccountToken(ctx context.Context, pod *v1.Pod, p *v1.ServiceAccountTokenProjection) (string, error) {
	if err := m.apiAllowed(pod); err != nil {
		return "", fmt.Errorf("service account token: %w", err)
	}
	sa := pod.Spec.ServiceAccountName
	if sa == "" {
		sa = pod.Spec.DeprecatedServiceAccount
	}
	if sa == "" {
		sa = "default"
	}
	expiration := int64(3600) // the API's default for a projection
	if p.ExpirationSeconds != nil {
		expiration = *p.ExpirationSeconds
	}
	key := tokenKey{uid: pod.UID, serviceAccount: sa, audience: p.Audience, expiration: expiration}
	now := m.opts.Now()
	m.mu.Lock()
	cached, ok := m.tokens[key]
	last, failedRecently := m.unreachable[key]
	m.mu.Unlock()
	if !ok {
		cached, ok = m.restoreToken(key, now)
	}
	if ok && now.Before(cached.renewAt) {
		return cached.token, nil
	}
	if failedRecently && now.Sub(last.at) < apiRetryInterval {
		if ok && cached.usable(now, last.err) {
			return cached.token, nil
		}
		return "", last.err
	}
	// A token that may still be mounted while the apiserver is out of reach: not asked for at
	// all if another request found it so a moment ago, and not waited on long (keptCopyWait).
	timeout := apiTimeout
	if ok && cached.usable(now, context.DeadlineExceeded) {
		if m.apiDownRecently() {
			return cached.token, nil
		}
		timeout = keptCopyWait
	}

	var audiences []string
	if p.Audience != "" {
		audiences = []string{p.Audience}
	}
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		Audiences:         audiences,
		ExpirationSeconds: &expiration,
		BoundObjectRef:    &authenticationv1.BoundObjectReference{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID},
	}}
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tr, err := m.client.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(rctx, sa, req, metav1.CreateOptions{})
	m.noteAPIResult(key, err)
	m.mu.Lock()
	if err != nil && unreachable(err) {
		m.unreachable[key] = failure{err: fmt.Errorf("failed to fetch token: %w", err), at: now}
	}
	m.mu.Unlock()
	if err != nil {
		if ok && cached.usable(now, err) {
			m.log.Warn("renew service account token; keeping the current one", "pod", pod.Namespace+"/"+pod.Name,
				"serviceAccount", sa, "expires", cached.expiresAt, "restored", cached.restored, "err", err)
			if cached.restored {
				m.mu.Lock()
				if _, registered := m.pods[pod.UID]; registered {
					m.tokens[key] = cached
				}
				m.mu.Unlock()
			}
			return cached.token, nil
		}
		return "", fmt.Errorf("failed to fetch token: %w", err)
	}
	lifetime := time.Duration(expiration) * time.Second
	if exp := tr.Status.ExpirationTimestamp.Time; !exp.IsZero() && exp.Sub(now) < lifetime {
		lifetime = exp.Sub(now)
	}
	t := cachedToken{
		token:     tr.Status.Token,
		renewAt:   now.Add(min(lifetime*8/10, maxTokenAge)),
		expiresAt: now.Add(lifetime),
	}
	m.mu.Lock()
	_, registered := m.pods[pod.UID]
	if registered {
		m.tokens[key] = t
	}
	m.mu.Unlock()
	if registered {
		m.keepToken(key, t, now)
	}
	return t.token, nil
}
