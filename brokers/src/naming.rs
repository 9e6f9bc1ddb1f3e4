/// How a message name becomes a broker destination (a NATS subject, an
/// AMQP routing key, a Redis stream key, a Kafka topic).
///
/// The destination is `prefix` followed by the name, after the first
/// matching rename: `NameMap::new("events.").rename("orders.placed",
/// "order.placed")` sends `orders.placed` to `events.order.placed` and
/// `users.created` to `events.users.created`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NameMap {
    prefix: String,
    renames: Vec<(String, String)>,
}

impl NameMap {
    /// Destinations are `prefix` + name.
    pub fn new(prefix: impl Into<String>) -> Self {
        NameMap {
            prefix: prefix.into(),
            renames: Vec::new(),
        }
    }

    /// Publish `name` as `to` (then prefixed).
    pub fn rename(mut self, name: impl Into<String>, to: impl Into<String>) -> Self {
        self.renames.push((name.into(), to.into()));
        self
    }

    /// The prefix every destination starts with.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The destination of `name`.
    pub fn destination(&self, name: &str) -> String {
        [self.prefix.as_str(), self.renamed(name)].concat()
    }

    /// `name` after the renames, before the prefix.
    pub(crate) fn renamed<'a>(&'a self, name: &'a str) -> &'a str {
        self.renames
            .iter()
            .find(|(from, _)| from == name)
            .map_or(name, |(_, to)| to.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::NameMap;

    #[test]
    fn renames_apply_before_the_prefix() {
        let map = NameMap::new("events.").rename("orders.placed", "order.placed");
        assert_eq!(map.destination("orders.placed"), "events.order.placed");
        assert_eq!(map.destination("users.created"), "events.users.created");
        assert_eq!(NameMap::default().destination("a.b"), "a.b");
    }
}
