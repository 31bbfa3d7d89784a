package nodeapi

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Cache lifetimes, the kubelet's webhook defaults.
const (
	tokenCacheTTL        = 2 * time.Minute
	tokenFailureCacheTTL = 10 * time.Second
	authzAllowedTTL      = 5 * time.Minute
	authzDeniedTTL       = 30 * time.Second
	// maxCacheEntries bounds each cache: past it, the cache is emptied (a burst of distinct
	// tokens must not grow the agent's memory).
	maxCacheEntries = 4096
	// reviewTimeout bounds one TokenReview or SubjectAccessReview.
	reviewTimeout = 10 * time.Second
)

// userInfo is an authenticated client.
type userInfo struct {
	Name   string
	UID    string
	Groups []string
	Extra  map[string][]string
}

// Errors of authentication and authorization; the handler maps them to HTTP statuses.
var (
	errUnauthenticated = errors.New("Unauthorized")
	// errReviewUnavailable: the apiserver could not be asked (out of reach).
	errReviewUnavailable = errors.New("the apiserver, which authenticates and authorizes node API requests, is out of reach")
)

// authenticator knows the clients: certificates of the client CA, tokens through TokenReview.
type authenticator struct {
	clientCAs *x509.CertPool // nil: no certificate is accepted
	client    kubernetes.Interface
	now       func() time.Time

	mu     sync.Mutex // protects tokens
	tokens map[string]tokenResult
}

type tokenResult struct {
	user    *userInfo // nil: not authenticated
	expires time.Time
}

// authenticate returns the request's user, errUnauthenticated, or errReviewUnavailable.
func (a *authenticator) authenticate(r *http.Request) (*userInfo, error) {
	if u := a.fromCertificate(r); u != nil {
		return u, nil
	}
	token, ok := bearerToken(r)
	if !ok {
		return nil, errUnauthenticated
	}
	return a.fromToken(r.Context(), token)
}

// fromCertificate returns the user of a client certificate that verifies against the client
// CA (CN: name, O: groups, as the kubelet's x509 authenticator), or nil.
func (a *authenticator) fromCertificate(r *http.Request) *userInfo {
	if a.clientCAs == nil || r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
		return nil
	}
	leaf := r.TLS.PeerCertificates[0]
	inter := x509.NewCertPool()
	for _, c := range r.TLS.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	_, err := leaf.Verify(x509.VerifyOptions{
		Roots:         a.clientCAs,
		Intermediates: inter,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		CurrentTime:   a.now(),
	})
	if err != nil || leaf.Subject.CommonName == "" {
		return nil
	}
	return &userInfo{Name: leaf.Subject.CommonName, Groups: slices.Clone(leaf.Subject.Organization)}
}

func bearerToken(r *http.Request) (string, bool) {
	h := r.Header.Get("Authorization")
	scheme, token, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}

func (a *authenticator) fromToken(ctx context.Context, token string) (*userInfo, error) {
	if a.client == nil {
		return nil, errUnauthenticated
	}
	sum := sha256.Sum256([]byte(token))
	key := hex.EncodeToString(sum[:])
	now := a.now()
	a.mu.Lock()
	if res, ok := a.tokens[key]; ok && now.Before(res.expires) {
		a.mu.Unlock()
		if res.user == nil {
			return nil, errUnauthenticated
		}
		return res.user, nil
	}
	a.mu.Unlock()

	ctx, cancel := context.WithTimeout(ctx, reviewTimeout)
	defer cancel()
	tr, err := a.client.AuthenticationV1().TokenReviews().Create(ctx, &authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("%w: TokenReview: %v", errReviewUnavailable, err)
	}
	res := tokenResult{expires: now.Add(tokenFailureCacheTTL)}
	if tr.Status.Authenticated {
		u := tr.Status.User
		res = tokenResult{expires: now.Add(tokenCacheTTL), user: &userInfo{Name: u.Username, UID: u.UID, Groups: u.Groups, Extra: map[string][]string{}}}
		for k, v := range u.Extra {
			res.user.Extra[k] = v
		}
	}
	a.mu.Lock()
	if len(a.tokens) >= maxCacheEntries {
		a.tokens = map[string]tokenResult{}
	}
	a.tokens[key] = res
	a.mu.Unlock()
	if res.user == nil {
		return nil, errUnauthenticated
	}
	return res.user, nil
}

// attributes is what is authorized: verb on nodes/NAME/SUBRESOURCE.
type attributes struct {
	Verb        string
	Subresource string
}

// requestAttributes maps a request to the attributes the kubelet checks, in order: the request
// is allowed when one of them is (the kubelet's nodeAuthorizerAttributesGetter, fine-grained
// authorization on).
func requestAttributes(method, path string) []attributes {
	verb := ""
	switch method {
	case http.MethodPost:
		verb = "create"
	case http.MethodGet, http.MethodHead:
		verb = "get"
	case http.MethodPut:
		verb = "update"
	case http.MethodPatch:
		verb = "patch"
	case http.MethodDelete:
		verb = "delete"
	}
	var subs []string
	switch {
	case isSubpath(path, "/pods"), isSubpath(path, "/runningpods"):
		subs = append(subs, "pods")
	case isSubpath(path, "/healthz"):
		subs = append(subs, "healthz")
	case isSubpath(path, "/configz"):
		subs = append(subs, "configz")
	}
	switch {
	case isSubpath(path, "/stats"):
		subs = append(subs, "stats")
	case isSubpath(path, "/metrics"):
		subs = append(subs, "metrics")
	case isSubpath(path, "/logs"):
		subs = append(subs, "log")
	case isSubpath(path, "/checkpoint"):
		subs = append(subs, "checkpoint")
	default:
		subs = append(subs, "proxy")
	}
	out := make([]attributes, 0, len(subs))
	for _, s := range subs {
		out = append(out, attributes{Verb: verb, Subresource: s})
	}
	return out
}

func isSubpath(sub, path string) bool {
	path = strings.TrimSuffix(path, "/")
	return sub == path || strings.HasPrefix(sub, path) && sub[len(path)] == '/'
}

// authorizer asks the apiserver with SubjectAccessReviews, and remembers the answers.
type authorizer struct {
	client   kubernetes.Interface
	nodeName string
	now      func() time.Time

	mu        sync.Mutex // protects decisions
	decisions map[string]decision
}

type decision struct {
	allowed bool
	reason  string
	expires time.Time
}

// authorize returns whether u may do a on this node, with the reviewer's reason, or
// errReviewUnavailable.
func (z *authorizer) authorize(ctx context.Context, u *userInfo, a attributes) (bool, string, error) {
	spec := authzv1.SubjectAccessReviewSpec{
		User: u.Name, UID: u.UID, Groups: u.Groups,
		ResourceAttributes: &authzv1.ResourceAttributes{
			Verb: a.Verb, Version: "v1", Resource: "nodes", Subresource: a.Subresource, Name: z.nodeName,
		},
	}
	if len(u.Extra) > 0 {
		spec.Extra = map[string]authzv1.ExtraValue{}
		for k, v := range u.Extra {
			spec.Extra[k] = v
		}
	}
	keyJSON, _ := json.Marshal(spec)
	key := string(keyJSON)
	now := z.now()
	z.mu.Lock()
	if d, ok := z.decisions[key]; ok && now.Before(d.expires) {
		z.mu.Unlock()
		return d.allowed, d.reason, nil
	}
	z.mu.Unlock()

	ctx, cancel := context.WithTimeout(ctx, reviewTimeout)
	defer cancel()
	sar, err := z.client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authzv1.SubjectAccessReview{Spec: spec}, metav1.CreateOptions{})
	if err != nil {
		return false, "", fmt.Errorf("%w: SubjectAccessReview: %v", errReviewUnavailable, err)
	}
	d := decision{allowed: sar.Status.Allowed, reason: sar.Status.Reason, expires: now.Add(authzDeniedTTL)}
	if d.allowed {
		d.expires = now.Add(authzAllowedTTL)
	}
	z.mu.Lock()
	if len(z.decisions) >= maxCacheEntries {
		z.decisions = map[string]decision{}
	}
	z.decisions[key] = d
	z.mu.Unlock()
	return d.allowed, d.reason, nil
}
