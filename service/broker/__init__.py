"""The Kafka edge (kafka-python): the consumer loop, the commit protocol, publishing."""
